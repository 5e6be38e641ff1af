"""The Kubernetes backend's I/O: create a job's objects, follow them, delete them.

Everything a job becomes comes from the pure builders (:mod:`.job`,
:mod:`.jobset`); this module only sends them with ``kubernetes_asyncio``,
which it imports when it first needs the cluster (importing gpulab loads no
kubeconfig). Whether JobSet is installed is asked once, from the API
discovery (``GET /apis``), at the first start.

Where a job stands comes from the Job's (or JobSet's) conditions: ``Complete``
is success, ``Failed`` a failure, whose root cause (which rank raised what) the
ranks wrote to the job directory on the shared volume, as on the local backend.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import time

from traitlets import Callable, Instance, default

from gpulab.enforcement.kube.kueue import QUEUE_LABEL
from gpulab.scheduler.slices import MILLI_PER_GPU

from ..base import Backend, JobStatus
from ..spec import JobSpec, SpecError
from . import jobset as jobset_mod
from .apiclient import ApiClientHolder
from .dra_claims import DRA_GROUP, DRA_VERSION, claim_plural, delete_claim
from .isolation import guard_objects, owned_by
from .job import KUEUE_ELASTIC_GATE, job_objects
from .job_settings import KubernetesJobsSettings, claim_template_name
from .kueue_status import (
    JOB_UID_LABEL,
    WORKLOAD_GROUP,
    WORKLOAD_PLURAL,
    WORKLOAD_VERSION,
    queue_state,
)
from .pods import JobOptions, check_spec, job_name, rdzv_secret_name

#: How long ``cancel`` waits for the cluster to remove a job's pods.
CANCEL_WAIT_S = 120.0
#: How long ``start`` waits for an earlier run's Job (or JobSet) to go, and how often
#: it looks.
STALE_WAIT_S = 60.0
STALE_POLL_S = 0.5
#: The conditions of a Job (or JobSet) that has finished, or is finishing, either way.
FINISHED = ("Complete", "Completed", "Failed", "FailureTarget", "SuccessCriteriaMet")
MERGE_PATCH = "application/merge-patch+json"
#: What the API server (or an admission webhook) answers a change it refuses.
REFUSED = (400, 403, 422)


class KubernetesBackend(KubernetesJobsSettings, Backend, ApiClientHolder):
    """Jobs as Indexed Jobs (or JobSets) in one namespace; the settings are
    :class:`~.job_settings.KubernetesJobsSettings` (``c.KubernetesJobsSettings.*``).

    A test or a site may hand over what the settings would make: ``options`` (where
    job directories live on the cluster, how jobs queue), ``pod_patch_for(spec,
    allocations)`` (the pod patch holding a node's slice, or None for none) and
    ``options_for(spec)`` (the :class:`JobOptions` fields that depend on the job's
    own priority class: ``labels``, ``pod_labels``, ``priority_class``).
    """

    name = "kubernetes"
    can_resize_in_place = True

    options = Instance(JobOptions, help="What every job's objects get.")
    pod_patch_for = Callable(
        allow_none=True, help="(spec, allocations) -> the pod patch of a node's slice."
    )
    options_for = Callable(
        allow_none=True, help="spec -> the JobOptions fields of the job's own class."
    )

    @default("options")
    def _from_settings(self) -> JobOptions:
        return self.base_options()

    @default("pod_patch_for")
    def _settings_patch(self):
        return self.settings_pod_patch

    @default("options_for")
    def _class_of(self):
        return lambda spec: self.class_options(spec.priority_class, spec.preemptible)

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        given = kwargs.get("options")
        if given is not None and given.jobs_root != self.root:
            raise SpecError(
                f"options.jobs_root ({given.jobs_root}) must be the service's "
                f"jobs directory ({self.root}): pods mount it at the same path"
            )
        self._groups: set[str] | None = None

    # -- the client (ApiClientHolder) ------------------------------------------------
    async def api_groups(self) -> set[str]:
        if self._groups is None:
            from kubernetes_asyncio import client

            found = await client.ApisApi(await self.api()).get_api_versions()
            self._groups = {g.name for g in found.groups or []}
        return self._groups

    async def _jobset(self, spec: JobSpec) -> bool:
        """Whether this job is a JobSet: what it was started as, else what the cluster
        has. Only a guess once it runs: its pods can rewrite launch.json (see _read)."""
        launch = self.jobdir(spec.id).read_json("launch.json", {}) or {}
        if "kind" in launch:
            return launch["kind"] == "JobSet"
        if self.use_jobset == "auto":
            return jobset_mod.GROUP in await self.api_groups()
        return bool(self.use_jobset)

    # -- hooks -----------------------------------------------------------------------
    def check(self, spec: JobSpec) -> None:
        check_spec(spec, self.options)  # its image among the site's allowed ones too
        job_name(spec)
        if spec.comm_hook == "bf16" and not spec.gpu_milli:
            raise SpecError(
                "comm hook bf16 needs NCCL, which needs GPUs; these ranks have "
                "none: use --comm-hook fp16 or powersgd"
            )
        if 0 < spec.gpu_milli < MILLI_PER_GPU and spec.nproc_per_node > 1:
            raise SpecError(
                "on Kubernetes a node's ranks share one pod, which holds one slice: "
                "use --nproc-per-node 1 with a fraction of a GPU, or whole GPUs"
            )

    def job_options(self, spec: JobSpec) -> JobOptions:
        """``options`` with what depends on this job (its priority class) filled in."""
        own = self.options_for(spec) if self.options_for else {}
        return dataclasses.replace(self.options, **own) if own else self.options

    def objects(self, spec: JobSpec, allocations: list[dict], jobset: bool) -> list[dict]:
        patch = self.pod_patch_for(spec, allocations) if self.pod_patch_for else None
        opts = dataclasses.replace(self.job_options(spec), pod_patch=patch)
        if jobset:
            return [jobset_mod.make_jobset(spec, opts)]
        return job_objects(spec, opts)

    async def start(self, spec: JobSpec, allocations: list[dict]) -> None:
        """The job's Secret and NetworkPolicy first (so no pod starts without them),
        then its Service and Job (or JobSet), which becomes their owner. An earlier
        run's Job (or JobSet) still there goes first (:meth:`_clear_earlier_run`)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        self.check(spec)
        # The service wrote the inputs at submit; the pods write logs beside them.
        os.makedirs(self.jobdir(spec.id).p("logs"), exist_ok=True)
        self._hand_over(spec)
        # Before anything is created: what the old run owned goes with it.
        await self._clear_earlier_run(spec)
        api = await self.api()
        jobset = await self._jobset(spec)
        guards = guard_objects(spec, self.job_options(spec), secrets.token_hex(32))
        # Under dra: the devices' claim template (or the card's shared claim) first.
        claims = self.settings_claim_objects(spec, allocations)
        objects = self.objects(spec, allocations, jobset)
        core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
        custom = client.CustomObjectsApi(api)
        created = None
        for obj in guards + claims + objects:
            try:
                if obj["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                    await custom.create_namespaced_custom_object(
                        DRA_GROUP, DRA_VERSION, self.namespace, claim_plural(obj), obj
                    )
                elif obj["kind"] == "Secret":
                    await core.create_namespaced_secret(self.namespace, obj)
                elif obj["kind"] == "NetworkPolicy":
                    await net.create_namespaced_network_policy(self.namespace, obj)
                elif obj["kind"] == "Service":
                    await core.create_namespaced_service(self.namespace, obj)
                elif obj["kind"] == "Job":
                    job = await client.BatchV1Api(api).create_namespaced_job(self.namespace, obj)
                    created = api.sanitize_for_serialization(job)
                else:
                    created = await client.CustomObjectsApi(api).create_namespaced_custom_object(
                        jobset_mod.GROUP, jobset_mod.VERSION, self.namespace, jobset_mod.PLURAL, obj
                    )
            except ApiException as e:
                # Already there: a start repeated after a crash (an earlier run's
                # objects were deleted above).
                if e.status != 409:
                    raise
        if created and (created.get("metadata") or {}).get("uid"):
            # Deleted with the job, however it goes (cancel, ttlSecondsAfterFinished).
            merge = "application/merge-patch+json"
            await core.patch_namespaced_secret(
                rdzv_secret_name(spec), self.namespace, owned_by(created), _content_type=merge
            )
            await net.patch_namespaced_network_policy(
                job_name(spec), self.namespace, owned_by(created), _content_type=merge
            )
            if not jobset:
                # The headless Service too: a Job that ttlSecondsAfterFinished (or a
                # user) deletes took its pods, Secret and policy along but left the
                # Service (found on a real cluster; JobSet makes and owns its own).
                await core.patch_namespaced_service(
                    job_name(spec), self.namespace, owned_by(created), _content_type=merge
                )
            for obj in claims:
                if obj["kind"] == "ResourceClaimTemplate":  # a shared card's claim stays
                    await custom.patch_namespaced_custom_object(
                        DRA_GROUP,
                        DRA_VERSION,
                        self.namespace,
                        claim_plural(obj),
                        obj["metadata"]["name"],
                        owned_by(created),
                        _content_type=merge,
                    )
        self.jobdir(spec.id).write_json(
            "launch.json",
            {
                "backend": self.name,
                "kind": objects[-1]["kind"],
                "namespace": self.namespace,
                "name": job_name(spec),
                "started": time.time(),
            },
        )

    def _hand_over(self, spec: JobSpec) -> None:
        """A service running as root (on a box) wrote the job's folder as root, 0600:
        the pods, never root, read it once it is handed to their uid and gid (their
        folders theirs, the inputs ``root:<gid> 0640``). The chart's service runs as
        the pods' uid already."""
        uid = self.run_as_user
        if os.geteuid() != 0 or uid is None:
            return
        gid = self.run_as_group if self.run_as_group is not None else uid
        self.jobdir(spec.id).hand_over(uid, gid)

    async def _clear_earlier_run(self, spec: JobSpec) -> None:
        """Make way for a new run of ``spec``. A Job (or JobSet) of its name that has
        finished (an earlier run: an elastic job relaunched after a failed node, or
        resized) or is being deleted (a cancel that outlasted its wait) is deleted in
        the foreground, with the Secret, NetworkPolicy and Service it owned, and waited
        for (STALE_WAIT_S): creating the new run on top of it would answer 409, and
        the old run would be taken for the new one. One that still runs, not being
        deleted, is this same run, started again after a crash: it stays."""
        kind, status, obj = await self._read(spec)
        if status is None:
            return
        deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        if not deleting and not _finished(status):
            return
        await self._delete(spec, kind)
        if not await self._wait_gone(spec, STALE_WAIT_S, STALE_POLL_S):
            raise RuntimeError(
                f"the {kind} {job_name(spec)} of an earlier run is still being deleted "
                f"from namespace {self.namespace} after {STALE_WAIT_S:g} s: the job "
                "cannot start again until it is gone"
            )

    async def _read(self, spec: JobSpec) -> tuple[str, dict | None, dict]:
        """(kind, the object's status as a dict, the object) or (kind, None, {}) when it
        does not exist."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        name = job_name(spec)
        # The kind in launch.json only says which to look for first: the job's pods
        # can rewrite it, and a job taken as gone has its GPUs given back.
        first = await self._jobset(spec)
        for jobset in (first, not first):
            try:
                if jobset:
                    # The object, not its /status subresource: the chart's Role grants
                    # jobs and jobsets, not their subresources.
                    obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                        jobset_mod.GROUP,
                        jobset_mod.VERSION,
                        self.namespace,
                        jobset_mod.PLURAL,
                        name,
                    )
                    return "JobSet", obj.get("status") or {}, obj
                job = await client.BatchV1Api(api).read_namespaced_job(name, self.namespace)
                obj = api.sanitize_for_serialization(job)
                return "Job", obj.get("status") or {}, obj
            except ApiException as e:
                # A site's own Role without jobsets: the other kind is not there.
                if e.status != 404 and not (e.status == 403 and jobset != first):
                    raise
        return ("JobSet" if first else "Job"), None, {}

    async def poll(self, spec: JobSpec) -> JobStatus:
        kind, status, obj = await self._read(spec)
        jd = self.jobdir(spec.id)
        if status is None:
            return JobStatus(
                "failed",
                restarts=jd.restarts(),
                message=f"the {kind} {job_name(spec)} is gone from namespace "
                f"{self.namespace} (deleted outside gpulab?)",
            )
        conditions = {
            c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"
        }
        restarts = max(
            jd.restarts(),
            int(status.get("restarts") or 0),
            int(status.get("failed") or 0) if kind == "Job" else 0,
        )
        details = {"kind": kind, "name": job_name(spec), "namespace": self.namespace}
        if "Complete" in conditions or "Completed" in conditions:
            return JobStatus("succeeded", exit_code=0, restarts=restarts, details=details)
        failed = conditions.get("Failed")
        if failed is None:
            queue = ((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
            if kind == "Job" and queue:
                return await self._queued_status(queue, obj, restarts, details)
            return JobStatus("running", restarts=restarts, details=details)
        errors = [e for e in jd.errors() if e.get("restart", 0) == jd.restarts()] or jd.errors()
        if errors:
            e = errors[0]
            return JobStatus(
                "failed",
                exit_code=1,
                restarts=restarts,
                error=e,
                details=details,
                message=f"rank {e.get('rank')} failed: {e.get('type')}: {e.get('message')}",
            )
        why = ": ".join(x for x in (failed.get("reason"), failed.get("message")) if x)
        return JobStatus(
            "failed",
            exit_code=1,
            restarts=restarts,
            details=details,
            message=f"the {kind} failed" + (f" ({why})" if why else ""),
        )

    async def _queued_status(self, queue: str, job: dict, restarts: int, details: dict):
        """A running (not finished) Job in Kueue ``queue``: still "running" to the
        service, with Kueue's word in the message and ``details["kueue"]``: waiting
        for quota (and why), admitted, or preempted (:mod:`.kueue_status`)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        suspended = bool((job.get("spec") or {}).get("suspend"))
        uid = (job.get("metadata") or {}).get("uid", "")
        try:
            found = await client.CustomObjectsApi(await self.api()).list_namespaced_custom_object(
                WORKLOAD_GROUP,
                WORKLOAD_VERSION,
                self.namespace,
                WORKLOAD_PLURAL,
                label_selector=f"{JOB_UID_LABEL}={uid}",
            )
            workloads = found.get("items") or []
        except ApiException as e:
            if e.status not in (403, 404):  # no Kueue, or no right to read its Workloads
                raise
            workloads = []
        state = queue_state(queue, suspended, workloads)
        return JobStatus(
            "running",
            restarts=restarts,
            details={**details, "kueue": state},
            message=state.get("message", ""),
        )

    # -- elastic jobs ----------------------------------------------------------------
    #: Whether :meth:`resize` shrinks a job in place. Off: the pods of the nodes that
    #: leave get SIGTERM, and every rank then agrees to stop at the same step
    #: (``gpulab.training.preemption``) and exits 0, so the pods that stay would
    #: succeed and complete the Job. A shrink is a relaunch until a rank that stops
    #: for another node's SIGTERM exits non-zero (torchrun then restarts it in a
    #: smaller round).
    shrink_in_place = False

    async def resize(self, spec: JobSpec, nodes: int, allocations: list[dict]) -> bool:
        """Resize the running elastic job ``spec`` to ``nodes`` in place: True when
        done, False when the service is to stop it and start it again at ``nodes``.

        In place is a merge patch of the Job's ``completions`` and ``parallelism``
        (equal, as Kubernetes requires of an elastic Indexed Job): the Job controller
        starts the pods of the new indexes (or removes the highest ones), and the
        running torchrun agents take the new nodes in at their next round. Every pod
        of a job has the same template, so a new node holds the same slice as the
        others (``allocations`` change nothing in it). False for:

        - a shrink (:attr:`shrink_in_place`);
        - a Job in a Kueue queue that Kueue did not take as elastic (no
          ``kueue.x-k8s.io/elastic-job`` scheduling gate in its template: Kueue older
          than 0.13 or ElasticJobsViaWorkloadSlices off), which Kueue would evict for
          its changed pod count;
        - a JobSet in a Kueue queue (Kueue has no elastic JobSets), or one whose
          webhook refuses the change (JobSet before v0.12, or its ElasticJobSet gate off);
        - a change the API server refuses (Kubernetes before 1.27).
        """
        if not spec.elastic or not spec.least_nodes <= nodes <= spec.most_nodes:
            raise SpecError(
                f"job {spec.id} cannot run on {nodes} nodes: its range is "
                f"{spec.least_nodes}:{spec.most_nodes}"
            )
        if (await self._read(spec))[0] == "JobSet":  # what the cluster has (see _read)
            return await self._resize_jobset(spec, nodes)
        return await self._resize_job(spec, nodes)

    def _in_place(self, now: int, nodes: int) -> bool | None:
        """True: nothing to change; False: not in place; None: patch it."""
        if nodes == now:
            return True
        if nodes < now and not self.shrink_in_place:
            return False
        return None

    async def _resize_job(self, spec: JobSpec, nodes: int) -> bool:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        batch = client.BatchV1Api(api)
        name = job_name(spec)
        job = api.sanitize_for_serialization(await batch.read_namespaced_job(name, self.namespace))
        done = self._in_place(int(job["spec"].get("parallelism") or 0), nodes)
        if done is not None:
            return done
        if QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {}):
            gates = job["spec"]["template"]["spec"].get("schedulingGates") or []
            if not any(g.get("name") == KUEUE_ELASTIC_GATE for g in gates):
                return False
        patch = {"spec": {"completions": nodes, "parallelism": nodes}}
        try:
            await batch.patch_namespaced_job(name, self.namespace, patch, _content_type=MERGE_PATCH)
        except ApiException as e:
            if e.status in REFUSED:
                return False
            raise
        return True

    async def _resize_jobset(self, spec: JobSpec, nodes: int, attempts: int = 3) -> bool:
        """The replicated Job's ``completions`` and ``parallelism``; the JobSet
        controller passes them on to its Job. A merge patch replaces the whole
        ``replicatedJobs`` list, so it is sent back as read, on the resourceVersion
        read (a JobSet changed in between is read again)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        custom = client.CustomObjectsApi(await self.api())
        where = (jobset_mod.GROUP, jobset_mod.VERSION, self.namespace, jobset_mod.PLURAL)
        name = job_name(spec)
        for attempt in range(attempts):
            js = await custom.get_namespaced_custom_object(*where, name)
            rjobs = js["spec"]["replicatedJobs"]
            [rjob] = [r for r in rjobs if r["name"] == jobset_mod.REPLICATED_JOB]
            job_spec = rjob["template"]["spec"]
            done = self._in_place(int(job_spec.get("parallelism") or 0), nodes)
            if done is not None:
                return done
            if QUEUE_LABEL in ((js.get("metadata") or {}).get("labels") or {}):
                return False  # Kueue would evict it for its changed pod count
            job_spec["completions"] = job_spec["parallelism"] = nodes
            patch = {"spec": {"replicatedJobs": rjobs}}
            version = (js.get("metadata") or {}).get("resourceVersion")
            if version:
                patch["metadata"] = {"resourceVersion": version}
            try:
                await custom.patch_namespaced_custom_object(
                    *where, name, patch, _content_type=MERGE_PATCH
                )
            except ApiException as e:
                if e.status == 409 and attempt + 1 < attempts:
                    continue  # changed since it was read: read it again
                if e.status in (*REFUSED, 409):
                    return False
                raise
            return True
        return False

    async def reattach(self, spec: JobSpec) -> bool:
        return (await self.poll(spec)).state == "running"

    async def close(self) -> None:
        await ApiClientHolder.close(self)  # Backend's hook comes first in the bases

    async def cancel(self, spec: JobSpec, grace_s: float | None = None) -> None:
        """Delete the job in the foreground (its pods go first) and wait until it is
        gone (``grace_s``, default CANCEL_WAIT_S; the cluster finishes after that)."""
        wait_s = CANCEL_WAIT_S if grace_s is None else grace_s
        # Whichever kind the cluster has (see _read), never the one that launch.json
        # in the pods' folder names.
        await self._delete(spec, (await self._read(spec))[0])
        await self._wait_gone(spec, wait_s)

    async def _delete(self, spec: JobSpec, kind: str) -> None:
        """Delete the job's ``kind`` (Job or JobSet) in the foreground, and what it
        owns; what is already gone is fine."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        name = job_name(spec)
        jobset = kind == "JobSet"
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        if jobset:
            deletes = [
                client.CustomObjectsApi(api).delete_namespaced_custom_object(
                    jobset_mod.GROUP,
                    jobset_mod.VERSION,
                    self.namespace,
                    jobset_mod.PLURAL,
                    name,
                    body=body,
                )
            ]
        else:
            deletes = [
                client.BatchV1Api(api).delete_namespaced_job(name, self.namespace, body=body),
                client.CoreV1Api(api).delete_namespaced_service(name, self.namespace),
            ]
        # Owned by the job, so gone with it; deleted here too, for a job started
        # before it owned them.
        deletes += [
            client.CoreV1Api(api).delete_namespaced_secret(rdzv_secret_name(spec), self.namespace),
            client.NetworkingV1Api(api).delete_namespaced_network_policy(name, self.namespace),
        ]
        for delete in deletes:
            try:
                await delete
            except ApiException as e:
                if e.status != 404:  # already gone is what we want
                    raise
        if self.enforcement == "dra":
            await delete_claim(api, self.namespace, claim_template_name(spec), template=True)

    async def _wait_gone(self, spec: JobSpec, wait_s: float, every_s: float = 1.0) -> bool:
        """Whether the job's Job (or JobSet) is gone within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            if (await self._read(spec))[1] is None:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(every_s)


def _finished(status: dict) -> bool:
    """Whether a Job's (or JobSet's) status says it finished, either way."""
    if status.get("terminalState") in FINISHED:  # a JobSet's, from JobSet v0.6
        return True
    return any(
        c.get("type") in FINISHED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
