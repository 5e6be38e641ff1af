"""The states a job and a deployment go through, as the service reports them.

The service's tables (``gpulab.db.jobs``, ``gpulab.db.deployments``) hold the same
tuples; magics and widgets may import only :mod:`gpulab.client`, so the user
side's copy lives here and ``tests/client/test_states.py`` keeps the two equal.
"""

from __future__ import annotations

#: Every state of a training job, in the order a job goes through them.
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
#: A job in one of these has ended and never changes again.
JOB_TERMINAL = ("succeeded", "failed", "cancelled")
#: A job in one of these still holds (or waits for) its place in the queue.
JOB_ACTIVE = ("queued", "running")

#: ``starting``: replicas launched, not all ready yet; ``running``: every replica
#: answers ready; ``degraded``: some replica is down and being restarted;
#: ``failed``: replicas kept crashing, the slices are released.
DEPLOYMENT_STATES = ("starting", "running", "degraded", "idle", "failed")
#: A deployment in one of these needs a look (its ``message`` says why).
DEPLOYMENT_UNHEALTHY = ("degraded", "failed")

__all__ = ["DEPLOYMENT_STATES", "DEPLOYMENT_UNHEALTHY", "JOB_ACTIVE", "JOB_STATES", "JOB_TERMINAL"]
