import pytest
from hubproc import RunningHub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A real hub per test module (simulated GPUs); its deployments stopped at the end."""
    h = RunningHub(tmp_path_factory.mktemp("deployhub"), simulate="2xA100-80GB")
    yield h
    for dep in h.gpulab("GET", "/deployments").json():
        h.gpulab("DELETE", f"/deployments/{dep['name']}", params={"user": dep["user"]})
    h.stop()
