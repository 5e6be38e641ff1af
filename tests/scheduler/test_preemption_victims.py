"""choose_victims: the least work lost, no more freed than needed, None when hopeless."""

from gpulab.scheduler.policy import Cluster, Request, get_policy
from gpulab.scheduler.preemption import Holder, choose_victims


def cluster_with(gpus_per_node, held):
    """Empty nodes of T4s, then take the milli each holder holds out of the free view."""
    nodes = [(f"n{i}", 64000, 262144, ["T4"] * g) for i, g in enumerate(gpus_per_node)]
    cluster = Cluster.build(nodes)
    for h in held:
        for node, slot, milli in h.slices:
            cluster.gpu_free[node, slot] -= milli
    return cluster


def holder(key, slices, at_risk, started=0.0):
    return Holder(key, "u", 100, tuple(slices), at_risk, started)


def keys(plan):
    return sorted(v.key for v in plan.victims)


POLICY = get_policy("best-fit")
ONE_GPU = Request(gpu_milli=1000, num_gpu=1)


def test_picks_the_holder_with_the_least_at_risk():
    holders = [holder("a", [(0, 0, 1000)], 500.0), holder("b", [(0, 1, 1000)], 20.0)]
    plan = choose_victims(cluster_with([2], holders), [ONE_GPU], holders, POLICY)
    assert keys(plan) == ["b"]


def test_frees_no_more_than_needed():
    # Half a GPU is free on slot 0; "tiny" (cheapest, 0.2) is not enough alone, so
    # the greedy pass adds "half" (0.5) too; then "tiny" is unnecessary and pruned.
    holders = [
        holder("tiny", [(0, 0, 200)], 1.0),
        holder("half", [(0, 0, 300)], 5.0),
    ]
    cluster = cluster_with([1], holders)  # slot 0: 1000 - 500 = 500 free
    plan = choose_victims(cluster, [Request(gpu_milli=800, num_gpu=1)], holders, POLICY)
    assert keys(plan) == ["half"]
    assert plan.freed_milli == 300


def test_none_when_even_every_holder_would_not_make_room():
    holders = [holder("a", [(0, 0, 500)], 1.0)]
    cluster = cluster_with([1], holders)
    assert choose_victims(cluster, [Request(gpu_milli=1000, num_gpu=2)], holders, POLICY) is None
    assert choose_victims(cluster, [ONE_GPU], [], POLICY) is None


def test_a_multi_gpu_request_takes_the_cheapest_node():
    # Node 0's two GPUs cost 100 + 100; node 1's cost 30 + 40: the 2-GPU request
    # goes where 70 GPU-seconds are lost.
    holders = [
        holder("a0", [(0, 0, 1000)], 100.0),
        holder("a1", [(0, 1, 1000)], 100.0),
        holder("b0", [(1, 0, 1000)], 30.0),
        holder("b1", [(1, 1, 1000)], 40.0),
    ]
    plan = choose_victims(
        cluster_with([2, 2], holders), [Request(gpu_milli=1000, num_gpu=2)], holders, POLICY
    )
    assert keys(plan) == ["b0", "b1"] and plan.at_risk == 70.0


def test_a_gang_of_two_requests():
    # Two 1-GPU ranks; four GPUs held on two nodes; the two cheapest go, wherever.
    holders = [
        holder("a0", [(0, 0, 1000)], 10.0),
        holder("a1", [(0, 1, 1000)], 90.0),
        holder("b0", [(1, 0, 1000)], 80.0),
        holder("b1", [(1, 1, 1000)], 20.0),
    ]
    plan = choose_victims(cluster_with([2, 2], holders), [ONE_GPU, ONE_GPU], holders, POLICY)
    assert keys(plan) == ["a0", "b1"]


def test_among_equal_losses_frees_the_least():
    # Both make room for 0.4 at the same loss; the 0.5 holder frees less than the
    # whole-GPU one, so less freed room is left over.
    holders = [holder("whole", [(0, 0, 1000)], 10.0), holder("half", [(0, 1, 500)], 10.0)]
    cluster = cluster_with([2], holders)
    cluster.gpu_free[0, 1] = 0  # the rest of slot 1 is held by a non-preemptible server
    plan = choose_victims(cluster, [Request(gpu_milli=400, num_gpu=1)], holders, POLICY)
    assert keys(plan) == ["half"]
