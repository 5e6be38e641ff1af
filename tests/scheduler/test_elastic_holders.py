"""Elastic jobs as preemption sees them: their nodes above MIN, taken first."""

from gpulab.scheduler.elastic import shrink_targets, surplus_holders
from gpulab.scheduler.policy import Cluster, Request, get_policy
from gpulab.scheduler.preemption import Holder, choose_victims


def test_only_nodes_above_min_are_offered_top_node_cheapest():
    nodes = [((0, 0, 1000),), ((0, 1, 1000),), ((0, 2, 1000),)]
    held = surplus_holders("job1", "bob", 100, nodes, 1, pause_s=10)
    assert [h.key for h in held] == ["job1#1", "job1#2"]
    assert held[1].at_risk < held[0].at_risk  # the top node costs least
    assert held[1].slices == ((0, 2, 1000),)


def test_a_plan_reads_back_as_the_size_each_job_shrinks_to():
    assert shrink_targets(["job1#2", "job1#1", "job2#3", "fixedjob", "owner/7"]) == {
        "job1": 1,
        "job2": 3,
    }


def test_a_request_takes_an_elastic_jobs_top_node_before_a_fixed_job():
    cluster = Cluster.build([("n0", 64000, 512000, ["A100"] * 4)])
    cluster.gpu_free[:] = 0  # every GPU held: by the fixed job and the elastic one
    fixed = Holder("fixed", "carol", 100, ((0, 0, 1000),), at_risk=600.0)
    elastic = surplus_holders(
        "el", "bob", 100, [((0, 1, 1000),), ((0, 2, 1000),), ((0, 3, 1000),)], 1, pause_s=10
    )
    plan = choose_victims(
        cluster, [Request(gpu_milli=500)], [fixed, *elastic], get_policy("gpulab")
    )
    assert [v.key for v in plan.victims] == ["el#2"]
    assert shrink_targets(v.key for v in plan.victims) == {"el": 2}
