"""Placement policies on small hand-built clusters where the right answer is known."""

import pytest

from gpulab.scheduler.policy import Cluster, Placement, Request, get_policy, policy_names

ALL = ["random", "best-fit", "packing", "dot-product", "fgd", "gpulab"]


def cluster(*nodes):
    """Nodes as (cpu cores, memory GiB, [GPU models]); returns a fresh Cluster."""
    return Cluster.build(
        [
            (f"n{i}", cpu * 1000, mem * 1024, list(models))
            for i, (cpu, mem, models) in enumerate(nodes)
        ]
    )


def place(name, c, request, **kw):
    placement = get_policy(name, **kw).place(c, request)
    if placement is not None:
        c.apply(placement, request)  # raises if the placement does not fit
    return placement


def test_every_policy_is_registered():
    assert set(ALL) <= set(policy_names())


@pytest.mark.parametrize("name", ALL)
def test_nothing_fits_means_none(name):
    c = cluster((8, 32, ["T4"]), (8, 32, ["T4"]))
    assert place(name, c, Request(gpu_milli=1000, num_gpu=2, cpu_milli=1000)) is None
    assert place(name, c, Request(gpu_milli=500, num_gpu=1, cpu_milli=9000)) is None
    assert place(name, c, Request(gpu_milli=500, num_gpu=1, memory_mib=40 * 1024)) is None


@pytest.mark.parametrize("name", ALL)
def test_gpu_spec_is_respected(name):
    c = cluster((32, 128, ["V100M16"] * 4), (32, 128, ["T4"] * 2), (32, 128, ["V100M32"] * 4))
    for seed in range(5):
        fresh = c.copy()
        p = place(
            name,
            fresh,
            Request(gpu_milli=300, num_gpu=1, cpu_milli=1000, gpu_models=frozenset({"T4"})),
            seed=seed,
        )
        assert p.node == 1
        p = place(
            name,
            fresh,
            Request(
                gpu_milli=1000,
                num_gpu=2,
                cpu_milli=1000,
                gpu_models=frozenset({"V100M16", "V100M32"}),
            ),
            seed=seed,
        )
        assert p.node in (0, 2)


@pytest.mark.parametrize("name", ALL)
def test_multi_gpu_takes_distinct_empty_cards_on_one_node(name):
    c = cluster((64, 256, ["A100"] * 2), (64, 256, ["A100"] * 8))
    c.gpu_free[1, 0] = 500  # one card of the big node is shared already
    p = place(name, c, Request(gpu_milli=1000, num_gpu=4, cpu_milli=4000))
    assert p.node == 1 and len(set(p.gpus)) == 4 and 0 not in p.gpus


@pytest.mark.parametrize("name", ALL)
def test_cpu_only_takes_no_gpu_and_needs_cpu(name):
    c = cluster((4, 64, ["T4"]), (64, 64, ["T4"]))
    for seed in range(5):
        p = place(name, c.copy(), Request(cpu_milli=16000, memory_mib=1024), seed=seed)
        assert p == Placement(1, ())


@pytest.mark.parametrize("name", ALL)
def test_a_full_cluster_is_filled_exactly(name):
    # Eight quarter slices on two cards: every policy must use all the room.
    c = cluster((64, 256, ["A100"] * 2))
    for _ in range(8):
        assert place(name, c, Request(gpu_milli=250, num_gpu=1, cpu_milli=100)) is not None
    assert c.gpu_free.sum() == 0
    assert place(name, c, Request(gpu_milli=250, num_gpu=1)) is None


def test_best_fit_fills_the_tightest_card_on_the_fullest_node():
    c = cluster((16, 64, ["A100"] * 2), (16, 64, ["A100"] * 2))
    c.gpu_free[1] = [1000, 300]  # node 1 is fuller; its second card is tight
    assert place("best-fit", c, Request(gpu_milli=250, num_gpu=1, cpu_milli=1000)) == Placement(
        1, (1,)
    )


def test_packing_prefers_a_shared_card_then_a_used_node():
    c = cluster((16, 64, ["A100"] * 2), (16, 64, ["A100"] * 2), (16, 64, ["A100"] * 2))
    c.gpu_free[2] = [1000, 600]
    assert place("packing", c, Request(gpu_milli=500, num_gpu=1)) == Placement(2, (1,))
    # A whole card: an empty card on the node already in use beats a fresh node.
    assert place("packing", c, Request(gpu_milli=1000, num_gpu=1)) == Placement(2, (0,))


def test_dot_product_sends_cpu_heavy_work_where_cpu_is_least_aligned():
    # Equal GPUs free; node 0 has far more CPU free, so a CPU-heavy task
    # aligns with it more and goes to node 1 instead (Tetris' complement rule).
    c = cluster((96, 256, ["T4"] * 2), (24, 256, ["T4"] * 2))
    assert place("dot-product", c, Request(gpu_milli=1000, num_gpu=1, cpu_milli=20000)).node == 1


def test_random_spreads_but_stays_feasible():
    c = cluster(*[(16, 64, ["T4"] * 2)] * 6)
    nodes = {
        get_policy("random", seed=s).place(c, Request(gpu_milli=500, num_gpu=1)).node
        for s in range(40)
    }
    assert len(nodes) >= 4


def _workload(milli, n=50, cpu=0):
    return [Request(gpu_milli=milli, num_gpu=1, cpu_milli=cpu)] * n


def test_fgd_keeps_the_remainder_usable_where_best_fit_does_not():
    # The workload is all half-GPU tasks. A 0.2 slice on the 0.6-free card would
    # leave 0.4 that no half-GPU task can use; on the empty card it leaves 0.8.
    c = cluster((16, 64, ["A100"] * 2))
    c.gpu_free[0] = [600, 1000]
    request = Request(gpu_milli=200, num_gpu=1)
    assert get_policy("best-fit").place(c, request).gpus == (0,)
    assert get_policy("fgd", workload=_workload(500)).place(c, request).gpus == (1,)


def test_fgd_fills_a_hole_nothing_else_could_use():
    c = cluster((16, 64, ["A100"]), (16, 64, ["A100"]))
    c.gpu_free[1] = [500]  # 0.5 free: useless to the 0.6-GPU workload
    assert place("fgd", c, Request(gpu_milli=400, num_gpu=1), workload=_workload(600)).node == 1


def test_fgd_is_deterministic_per_seed():
    c = cluster(*[(16, 64, ["T4"] * 2)] * 8)
    picks = [
        get_policy("fgd", workload=_workload(500), seed=7).place(
            c, Request(gpu_milli=500, num_gpu=1)
        )
        for _ in range(2)
    ]
    assert picks[0] == picks[1]


def test_gpulab_without_workload_behaves_like_a_ledger_wants():
    # The ledger: one node, CPU and memory untracked, no history.
    c = Cluster.build([("n1", 1 << 40, 1 << 40, ["A100-80GB"] * 2)])
    policy = get_policy("gpulab")
    quarters = []
    for _ in range(3):
        p = policy.place(c, Request(gpu_milli=250, num_gpu=1))
        c.apply(p, Request(gpu_milli=250, num_gpu=1))
        quarters.append(p.gpus)
    assert quarters[0] == quarters[1] == quarters[2]  # fill one card before the next
    whole = policy.place(c, Request(gpu_milli=1000, num_gpu=1))
    assert whole.gpus != quarters[0]  # a whole card goes to the empty one
    assert policy.place(c, Request(gpu_milli=1000, num_gpu=2)) is None


def test_gpulab_matches_cpu_light_work_to_cpu_poor_nodes():
    # Identical cards and identical fragmentation: only the CPU per GPU differs.
    c = cluster((4, 64, ["T4"]), (64, 64, ["T4"]))
    light = Request(gpu_milli=810, num_gpu=1, cpu_milli=3000)
    heavy = Request(gpu_milli=810, num_gpu=1, cpu_milli=3000 * 10)
    assert get_policy("gpulab").place(c, light).node == 0
    assert get_policy("gpulab").place(c, heavy).node == 1


def test_gpulab_keeps_the_only_big_node_for_the_jobs_that_need_it():
    # Only node 0 can host the workload's 8-GPU, 120-CPU jobs; a 1-GPU task
    # that fits both goes to node 1 even when node 0 comes first in node order.
    c = cluster((128, 512, ["G3"] * 8), (96, 512, ["G2"] * 8))
    workload = [Request(gpu_milli=1000, num_gpu=8, cpu_milli=120_000)] * 5 + [
        Request(gpu_milli=1000, num_gpu=1, cpu_milli=10_000)
    ] * 50
    for seed in range(6):
        assert (
            get_policy("gpulab", workload=workload, seed=seed)
            .place(c, Request(gpu_milli=1000, num_gpu=1, cpu_milli=10_000))
            .node
            == 1
        )


def test_policies_accept_the_ledger_call_from_threads():
    from concurrent.futures import ThreadPoolExecutor

    policy = get_policy("gpulab")
    clusters = [Cluster.build([("n1", 1 << 40, 1 << 40, ["A100"] * 2)]) for _ in range(16)]
    with ThreadPoolExecutor(4) as pool:
        picks = list(
            pool.map(lambda cl: policy.place(cl, Request(gpu_milli=250, num_gpu=1)), clusters)
        )
    assert all(p is not None and p.node == 0 for p in picks)


def test_unknown_policy_names_what_exists():
    with pytest.raises(ValueError, match="registered: .*gpulab"):
        get_policy("no-such-policy")


def test_gpulab_keeps_constrained_models_for_the_tasks_that_insist_on_them():
    # A few tasks accept only T4 (too few to enter FGD's typical mix); an
    # unconstrained task that fits both nodes goes to the other model.
    c = cluster((32, 128, ["T4"] * 2), (32, 128, ["G2"] * 2))
    workload = [
        Request(gpu_milli=1000, num_gpu=1, cpu_milli=4000, gpu_models=frozenset({"T4"}))
    ] * 4 + [Request(gpu_milli=1000, num_gpu=1, cpu_milli=4000)] * 96
    for seed in range(6):
        assert (
            get_policy("gpulab", workload=workload, seed=seed)
            .place(c, Request(gpu_milli=1000, num_gpu=1, cpu_milli=4000))
            .node
            == 1
        )
