"""The fragmentation measure against hand-computed values."""

import numpy as np

from gpulab.scheduler.policies.fragmentation import (
    FragState,
    TaskType,
    TypicalMix,
    cluster_frag_pct,
)
from gpulab.scheduler.policy import Cluster, Placement, Request


def test_node_fragmentation_by_hand():
    # Mix: half 0.5-GPU tasks needing 8 CPUs, half CPU-only tasks.
    mix = TypicalMix([TaskType(500, 1, 8000, None, 1), TaskType(0, 0, 1000, None, 1)])
    c = Cluster.build([("a", 16000, 1, ["T4", "T4"]), ("b", 4000, 1, ["T4", "T4"])])
    c.gpu_free[:] = [[1000, 300], [1000, 300]]
    state = FragState(mix, c)
    # Node a: the 0.5 type can use the empty card (1000) but not the 0.3 one;
    # CPU-only tasks can use no GPU at all: 1300 - 0.5 * 1000.
    # Node b: too little CPU for the 0.5 type, so all 1300 is fragmented.
    assert np.allclose(state.frag, [800.0, 1300.0])
    assert np.isclose(cluster_frag_pct(state), 100 * 2100 / 4000)


def test_model_constraints_make_other_nodes_fragmented():
    mix = TypicalMix([TaskType(1000, 1, 0, frozenset({"V100M32"}), 1)])
    c = Cluster.build([("a", 1000, 1, ["V100M32"]), ("b", 1000, 1, ["T4"])])
    assert np.allclose(FragState(mix, c).frag, [0.0, 1000.0])


def test_after_matches_recomputing_from_scratch():
    rng = np.random.default_rng(1)
    mix = TypicalMix(
        [
            TaskType(int(m), 1, int(cpu), None, float(w))
            for m, cpu, w in zip(
                [160, 470, 810, 1000], [4000, 12000, 3000, 11000], [1, 3, 4, 6], strict=False
            )
        ]
        + [TaskType(1000, 2, 20000, None, 1.0)]
    )
    c = Cluster.build([(f"n{i}", 96000, 1, ["G2"] * 8) for i in range(20)])
    c.gpu_free[:] = rng.choice([0, 190, 530, 1000], size=c.gpu_free.shape)
    c.cpu_free[:] = rng.integers(0, 96000, size=20)
    state = FragState(mix, c)
    request = Request(gpu_milli=470, num_gpu=1, cpu_milli=5000)
    nodes, slots = np.nonzero(c.eligible_gpus(request) & c.feasible_nodes(request)[:, None])
    predicted = state.after(nodes, c.gpu_free[nodes, slots][:, None], 470, 5000)
    for node, slot, value in zip(nodes, slots, predicted, strict=False):
        trial = c.copy()
        trial.apply(Placement(int(node), (int(slot),)), request)
        assert np.isclose(FragState(mix, trial).frag[node], value)


def test_sync_only_recomputes_what_changed():
    mix = TypicalMix.default()
    c = Cluster.build([(f"n{i}", 8000, 1, ["A100"] * 2) for i in range(3)])
    state = FragState(mix, c)
    before = state.frag.copy()
    c.apply(Placement(1, (0,)), Request(gpu_milli=250, num_gpu=1))
    state.sync()
    assert state.frag[0] == before[0] and state.frag[2] == before[2]
    assert np.isclose(state.frag[1], FragState(mix, c).frag[1])


def test_typical_mix_keeps_the_popular_shapes():
    workload = (
        [Request(gpu_milli=500, num_gpu=1)] * 90
        + [Request(gpu_milli=300, num_gpu=1)] * 6
        + [Request(gpu_milli=100, num_gpu=1)] * 4
    )
    mix = TypicalMix.from_workload(workload, popularity=0.95)
    assert [t.gpu_milli for t in mix.types] == [500, 300]
    assert np.isclose(sum(t.weight for t in mix.types), 1.0)
    assert {t.gpu_milli for t in TypicalMix.default().types} == {100, 250, 500, 1000}
