import pytest


@pytest.fixture(scope="module")
def hub(plain_hub):
    """The session's shared hub (simulated GPUs); each module's deployments, jobs and
    servers stopped at its end (tests/conftest.py)."""
    return plain_hub
