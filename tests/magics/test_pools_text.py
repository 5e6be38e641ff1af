"""What ``%gpulab`` and ``%gpulab pools`` print for a site's pools: the answer of
``GET /pools`` (its shape is checked live in tests/slurm/test_pools.py) in words."""

from gpulab.magics.pools import pools_text, status_line

TWO = {
    "default": "auto",
    "servers": "box",
    "endpoints": "box",
    "pools": [
        {
            "name": "box",
            "backend": "local",
            "gpus": 1,
            "free": [{"milli": 250, "label": "1/4 GPU", "count": 0}],
            "reason": None,
        },
        {
            "name": "slurm",
            "backend": "slurm",
            "gpus": 4,
            "free": [
                {"milli": 250, "label": "1/4 GPU", "count": 16},
                {"milli": 1000, "label": "1 GPU", "count": 4},
            ],
            "reason": None,
        },
    ],
}


def test_the_pools_table_says_the_order_and_each_pools_free_slices():
    assert pools_text(TWO).splitlines() == [
        "Pools (a job without --pool runs on the first pool with room, in this order):",
        "  box          local         1 GPU  free: full",
        "  slurm        slurm        4 GPUs  free: 1/4 GPU x16, 1 GPU x4",
        "Servers: pool box; endpoints: pool box",
    ]


def test_the_status_line_is_one_line_per_site(monkeypatch):
    import gpulab.magics.pools as pools

    monkeypatch.setattr(pools, "_fetch", lambda timeout=None: TWO)
    env = {"GPULAB_API_URL": "http://127.0.0.1:1/services/gpulab/api/v1"}
    assert status_line(env) == (
        "Pools: box (local) full; slurm 1/4 GPU x16, 1 GPU x4; jobs go to the first with room"
    )
    assert status_line({}) is None  # not a server gpulab started


def test_a_service_that_does_not_answer_is_one_line(monkeypatch):
    import gpulab.magics.pools as pools

    def down(timeout=None):
        raise OSError("connection refused")

    monkeypatch.setattr(pools, "_fetch", down)
    env = {"GPULAB_API_URL": "http://127.0.0.1:1/services/gpulab/api/v1"}
    assert status_line(env) == "Pools: could not ask the service (connection refused)"
