"""The user side's job and deployment states are the service's.

Magics and widgets may import only gpulab.client; the service's tables keep
their own tuples (gpulab.db must not import the client). This keeps them equal.
"""

import os
import re

from gpulab.client import states
from gpulab.db import deployments as db_deployments
from gpulab.db import jobs as db_jobs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_job_states_are_the_services():
    assert states.JOB_STATES == db_jobs.STATES
    assert states.JOB_TERMINAL == db_jobs.TERMINAL
    assert set(states.JOB_ACTIVE) == set(db_jobs.STATES) - set(db_jobs.TERMINAL)


def test_deployment_states_are_the_services():
    assert states.DEPLOYMENT_STATES == db_deployments.STATES
    assert set(states.DEPLOYMENT_UNHEALTHY) <= set(states.DEPLOYMENT_STATES)


def test_no_copy_of_the_terminal_states_outside_db_and_client():
    # A literal copy drifts; import gpulab.client.states (or gpulab.db.jobs) instead.
    copy = re.compile(r"""=\s*\(\s*["']succeeded["']\s*,\s*["']failed["']\s*,\s*["']cancelled""")
    found = []
    for folder in (
        "magics",
        "widgets",
        "client",
        "service",
        "scheduler",
        "backend",
        "hub_ext",
        "spawner",
        os.path.join("tests", "jobs"),
    ):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                path = os.path.join(dirpath, name)
                if name.endswith(".py") and path != os.path.join(ROOT, "client", "states.py"):
                    with open(path, encoding="utf-8") as f:
                        if copy.search(f.read()):
                            found.append(os.path.relpath(path, ROOT))
    assert not found, f"copies of the job states: {found}"
