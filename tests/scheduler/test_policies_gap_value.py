"""gpulab's gap value: what a card's free milli is expected to waste in the end."""

from gpulab.scheduler.policies.gap_value import GapValue
from gpulab.scheduler.policy import Cluster, Request, get_policy


def cards(free):
    """One single-GPU node per entry, the card with ``free`` milli free."""
    c = Cluster.build([(f"n{i}", 1 << 40, 1 << 40, ["A100"]) for i in range(len(free))])
    c.gpu_free[:, 0] = free
    return c


def test_a_gap_that_a_common_size_fills_exactly_is_worth_keeping():
    # Plenty of empty cards: plenty of work still to come.
    table = GapValue({220: 0.2, 320: 0.2}, mean_milli=500).compute(cards([1000] * 100))
    assert table[0] == 0
    assert table[210] == 210  # nothing in the workload fits: all of it is lost
    assert table[220] == 0 and table[320] == 0 and table[540] == 0
    assert 0 < table[350] <= 30  # a 0.32 slice leaves 0.03


def test_a_gap_many_others_wait_for_is_worth_little():
    # The rare 0.16 slices: enough for a few 0.19 gaps, not for hundreds.
    value = GapValue({160: 0.01, 810: 0.2}, mean_milli=700)
    assert value.compute(cards([190] * 2 + [1000] * 2000))[190] < 60
    assert value.compute(cards([190] * 400 + [1000] * 2000))[190] > 150


def test_gpulab_puts_a_slice_where_a_coming_size_completes_the_card():
    # Workload: 0.65 + 0.32 and 0.55 + 0.23 + 0.22 make full cards. A 0.23 slice
    # in the tighter 0.35 gap would strand 0.12 (and take a 0.32's place); in
    # the 0.45 gap it leaves exactly what a 0.22 slice fills.
    workload = [
        Request(gpu_milli=m, num_gpu=1, cpu_milli=1000) for m in (650, 320, 550, 230, 220)
    ] * 20
    c = cards([350, 450] + [1000] * 50)
    request = Request(gpu_milli=230, num_gpu=1, cpu_milli=1000)
    for seed in range(4):
        assert get_policy("gpulab", workload=workload, seed=seed).place(c, request).node == 1
    assert get_policy("best-fit").place(c, request).node == 0
