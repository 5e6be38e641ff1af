"""How the job queue admits, orders and preempts jobs: ``c.JobQueue.*`` in the
service's config, read by :class:`~gpulab.service.jobs.manager.JobManager` and its
parts (and by the job backends, for the preemption grace)."""

from __future__ import annotations

import math

from traitlets import Float, Int, TraitError, validate
from traitlets.config import Configurable

from ..setting_checks import positive, setting_name, zero_or_more

#: The longest fair-share half-life: some three years (a year is 3.2e7 s).
MAX_HALF_LIFE_S = 1e8


class JobQueue(Configurable):
    """The caps on one job, the queue's fair share, preemption and elastic growth."""

    max_job_ranks = Int(
        64,
        help="""Most ranks one job may have (nodes x nproc_per_node), CPU-only jobs too:
        each rank is a process on a node of the cluster.

        c.JobQueue.max_job_ranks = 256
        """,
    ).tag(config=True)

    max_job_vars_mib = Int(
        256,
        help="""Largest variables a job may carry, in MiB (the cloudpickle bytes of
        `%%train_distributed --vars`, before base64). Larger data belongs in a dataset
        the ranks read (the dataset cache), not in the request.

        c.JobQueue.max_job_vars_mib = 1024
        """,
    ).tag(config=True)

    max_queued_jobs_per_user = Int(
        500,
        help="""Most jobs one user may have waiting in the queue at once; a submit over
        it is refused (HTTP 429) until some start or are cancelled. Every pass of the
        queue reads the waiting jobs, and each keeps its variables on disk, so one
        user's thousands of submits would slow and fill the service for everyone.
        Running jobs do not count, nor do schedules until they submit.

        c.JobQueue.max_queued_jobs_per_user = 2000
        """,
    ).tag(config=True)

    max_schedules_mib = Int(
        64,
        help="""The most MiB the job bodies of one user's schedules take together, as
        stored (a notebook job's notebook, parameters and packaged files, in base64).
        Each schedule keeps its body in the service's database and submits it at every
        run, so data belongs in a folder or dataset the job reads, not in the schedule.

        c.JobQueue.max_schedules_mib = 256
        """,
    ).tag(config=True)

    preemption_grace_seconds = Float(
        30.0,
        help="""Seconds a preempted job gets between SIGTERM and SIGKILL. gpulab's
        training library saves a checkpoint at the next step boundary and exits
        within it; the job goes back to the queue and resumes from there.

        c.JobQueue.preemption_grace_seconds = 60
        """,
    ).tag(config=True)

    fair_share_half_life_seconds = Float(
        7 * 86400.0,
        help="""Half-life of past GPU use in the queue's fair share. Queued jobs of
        one class start in order of their owner's decayed use, least first (a
        GPU-hour one half-life ago weighs half as much as one now).

        c.JobQueue.fair_share_half_life_seconds = 86400
        """,
    ).tag(config=True)

    elastic_grow_after_seconds = Float(
        10.0,
        help="""Seconds an elastic job (`--nodes MIN:MAX`) runs at one size before
        it may grow into free slices again. Growing restarts its ranks from a
        checkpoint taken at a step boundary, so it is not done for every slice
        that frees; this also spaces a job's regrowth after a failed node.

        c.JobQueue.elastic_grow_after_seconds = 60
        """,
    ).tag(config=True)

    @validate(
        "max_job_ranks",
        "max_job_vars_mib",
        "max_queued_jobs_per_user",
        "max_schedules_mib",
    )
    def _positive(self, proposal):
        return positive(proposal)

    @validate("fair_share_half_life_seconds")
    def _half_life(self, proposal):
        # Each pass reads ten half-lives of use back from now: NaN, inf or some 6e9 s
        # reach before year 1, and the queue's ordering would fail in every pass.
        value = proposal.value
        if not (math.isfinite(value) and 0 < value <= MAX_HALF_LIFE_S):
            raise TraitError(
                f"{setting_name(proposal)} must be a number of seconds above 0 and at "
                f"most {MAX_HALF_LIFE_S:.0e} (a week is 604800), got {value}"
            )
        return value

    @validate("preemption_grace_seconds", "elastic_grow_after_seconds")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "no wait")
