import asyncio
import concurrent.futures
import os
import sys

import pytest

# Make the test helpers in this folder importable as plain modules, and the
# training cells every room's tests run (tests/training/cells.py).
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "training"))

from hubproc import RunningHub  # noqa: E402
from pg import fresh_database, postgres_server  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Files with a slow test first, each file's tests in their order: the workers
    (``--dist loadfile``) take files in this order, so the suite ends on short files
    and the workers finish together; a slow file taken last had kept one worker a
    minute after the others."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Lines an xdist worker asked to show (tests/kube/conftest.py's ``say``: the live
    cluster's build and start times, its API server's version): a worker's own output
    never reaches the terminal."""
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    for line in (getattr(node, "workeroutput", None) or {}).get("gpulab_say", []):
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(line)


#: Settings of the shared hub itself: its one job queue's, which a module cannot set
#: for itself without starting a hub of its own. A module's users get their quotas and
#: guarantees from hub groups of the module's own (tests/support/group_limits.py).
SHARED_HUB_CONFIG = """
# tests/jobs/test_preemption.py: victims that never checkpoint (SLEEPS) are killed when
# the grace ends, which need not be 30 s (a checkpointing one saves at its next step,
# within a second).
c.JobQueue.preemption_grace_seconds = 10
# tests/jobs/test_elastic.py: an elastic job grows back a few seconds after a resize.
c.JobQueue.elastic_grow_after_seconds = 3
# tests/deploy/test_endpoint_scaling.py: GPU endpoints shrink after their own short
# delays (the 60 s floor of a site's is tested in tests/deploy/test_scale_down_delay.py).
c.Endpoints.min_gpu_scale_down_delay_s = 0
"""


@pytest.fixture(scope="session", autouse=True)
async def roomy_default_executor():
    """The session's one event loop runs every async test's in-process service, hub
    stand-in and the threads tests send their requests from. Python's default pool
    has cores + 4 threads (6 on CI's 2 cores), which the service's own blocking calls
    (audit, unpacking, name lookups) then share with the tests' waiting requests:
    room for both, so a request never waits for a thread the test itself holds."""
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="asyncio")
    loop.set_default_executor(pool)
    yield
    pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the whole session."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres_db(postgres_url):
    """An empty PostgreSQL database of this test's own (on the session's server)."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def artifacts_dir():
    """Where tests keep what a person would look at (screenshots)."""
    path = os.environ.get("GPULAB_TEST_ARTIFACTS") or os.path.join(
        os.path.dirname(__file__), "artifacts"
    )
    os.makedirs(path, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def shared_hub(tmp_path_factory):
    """One real hub (`gpulab up`, two simulated A100s, accounts when root) for every
    module that needs no hub settings of its own. Started once per session.

    Modules use it through :func:`plain_hub` (or clear it themselves), which stops
    what they started; they take user names of their own (``hubproc.fresh_user``)."""
    h = RunningHub(
        tmp_path_factory.mktemp("shared-hub"),
        simulate="2xA100-80GB",
        config=SHARED_HUB_CONFIG,
        mlflow_runs=True,  # tests/experiments/: jobs' runs in MLflow
    )
    yield h
    h.stop()


@pytest.fixture(scope="module")
def plain_hub(shared_hub):
    """The shared hub for one module; afterwards no server, job or deployment of the
    module is left running and the ledger is empty again."""
    yield shared_hub
    shared_hub.clear()


@pytest.fixture(autouse=True)
def usual_umask():
    """Each test starts with the usual umask 022. The service and the hub set 077 for
    their own files (in-process in some tests); left over, it would make the next
    test's folders unreachable for the users' accounts its jobs run as."""
    os.umask(0o022)
    yield
