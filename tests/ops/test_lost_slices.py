"""What the lost-slices finder names for a job or an endpoint whose members lost
their slice rows (the server case runs on a real hub in tests/hub/test_attacks.py)."""

from gpulab.service.operations.lost_slices import finding, unheld


def test_the_members_without_a_row_are_named_with_what_they_should_hold():
    held = {("job", "j1/0"), ("job", "j1/2"), ("deployment", "j1/1")}
    assert unheld(held, "job", "j1", 4) == [1, 3]  # another kind's row holds nothing
    assert unheld(held, "job", "j1", 0) == []  # no GPU asked: nothing to lose
    job = {"id": "j1", "user": "ann", "gpu_milli": 250}
    assert finding("job", job, [1, 3], "job j1 is running but ranks 1, 3") == {
        "owner_kind": "job",
        "owner": "j1",
        "user": "ann",
        "milli": 500,
        "message": "job j1 is running but ranks 1, 3 hold no slice",
    }
