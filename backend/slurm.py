"""The Slurm backend: a job is one ``sbatch`` allocation across its nodes.

``start`` renders every node's torchrun command line (:func:`.render.render_node`,
the same as the local and Kubernetes backends) into ``JOB/slurm/node<R>.json``
and submits ``JOB/slurm/batch.sh``::

    sbatch --nodes=N --ntasks-per-node=1 [--gres=gpu:G | --gres=shard:K]
           [--nodelist=<the ledger's nodes>] -J gpulab-<id> --comment=gpulab:<id>
           -D JOB -o JOB/logs/slurm-%j.out --export=NONE [--uid --gid] batch.sh

whose one line runs ``srun --kill-on-bad-exit=1 python -m gpulab.backend.slurm_launch
JOB``: one launcher per node picks its node file and runs torchrun (rendezvous on
the first node). Worker failures are torchrun's (``--max-restarts``, the job's own
restart count; checkpoints on the shared job dir); a dead agent ends the step
(``--kill-on-bad-exit``) and so the job.

The Slurm job id is kept in ``JOB/slurm/job_id``: ``poll``, ``reattach`` after a
service restart and ``cancel`` (``scancel``, then wait until ``squeue`` no longer
lists it) all go by it. Logs, metrics, errors and each node's exit code are the
job dir's files, as with the local backend, so ``poll`` finds the root cause the
same way (:mod:`.failures`).

With per-user accounts (:class:`gpulab.enforcement.accounts.UserAccounts`) root
submits for the owner (``sbatch --uid --gid``): Slurm runs the ranks as the owner,
their ``squeue`` shows the job (``PrivateData=jobs`` hides it from others) and the
job dir is handed over as for local jobs. The ranks get only :data:`.local.PASS_ENV`,
the account's variables (``--export=NONE``, then the node file's environment) and
Slurm's own ``SLURM_*`` variables of their node's task (``SLURM_JOB_ID``,
``SLURM_NODEID``, ``SLURM_JOB_NODELIST``...; :mod:`.slurm_launch`), never the
service's tokens.

The nodes' agents rendezvous with gpulab's signed c10d (``--rdzv-backend=gpulab``,
:mod:`gpulab.training.rendezvous`) under the job's secret, ``JOB/rdzv.secret``
(``root:<owner's private group> 0640`` once handed over: the owner's ranks read it
on every node through the shared filesystem); the node files name it, never its value.
Node rank 0's agent binds the store to its node's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import time

from traitlets import Instance, Unicode, default

from gpulab.enforcement.accounts import separated
from gpulab.enforcement.user_env import user_python
from gpulab.scheduler.slices import MILLI_PER_GPU

from .base import Backend, JobStatus
from .failures import NODE0_LOG, failure
from .local import PASS_ENV, owner_account
from .render import render_node, torchrun_argv
from .slurm_inventory import (
    SHARD_POOL,
    WHOLE_POOL,
    SlurmInventory,
    gres_request,
    shards_per_gpu,
)
from .slurm_site import ACTIVE_STATES, SlurmError, SlurmSite
from .spec import JobSpec

#: How long ``cancel`` waits for Slurm to forget a cancelled job in squeue.
CANCEL_WAIT_S = 60.0


class SlurmBackend(Backend):
    name = "slurm"
    can_preempt = True
    #: Each node rank runs on a node of its own: the ledger places them apart.
    nodes_apart = True

    site = Instance(SlurmSite, help="The Slurm cluster (c.SlurmSite).")
    pool = Unicode(
        help="""Shards of one GPU per slice, or whole GPUs: the inventory's rule
        (c.SlurmInventory.whole_gpus), so Slurm holds what the ledger placed."""
    )

    @default("site")
    def _configured_site(self) -> SlurmSite:
        return SlurmSite(parent=self)

    @default("pool")
    def _inventory_rule(self) -> str:
        return SlurmInventory(parent=self).pool()

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        self.accounts, _ = separated(self.root, self.accounts, None)
        self._node_gres: dict[str, dict] | None = None

    # -- the Slurm job id, kept in the job dir -------------------------------------------
    def slurm_id(self, spec: JobSpec) -> str | None:
        return self.slurm_job_id(spec.id)

    def slurm_job_id(self, job_id: str) -> str | None:
        """The Slurm job id kept in the job dir (None before sbatch answered)."""
        try:
            with open(self.jobdir(job_id).p("slurm", "job_id")) as f:
                return f.read(32).strip() or None
        except OSError:
            return None

    # -- submitting ------------------------------------------------------------------------
    def _base_env(self, home: str) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env["HOME"] = home
        return env

    async def _gres(self, spec: JobSpec, nodes: list[str]) -> list[str]:
        """``--gres`` for a node's ranks: ``shard:K`` per slice (or ``gpu:N`` on a
        partition of whole GPUs), times the ranks per node, as the inventory counts
        them (:func:`.slurm_inventory.gres_request`)."""
        if not spec.gpu_milli:
            return []
        if self._node_gres is None:
            self._node_gres = {n["name"]: n["gres"] for n in await self.site.nodes()}
        gres = [self._node_gres[n] for n in nodes if n in self._node_gres]
        gres = gres or [g for g in self._node_gres.values() if g.get("gpu")]
        if not gres:
            raise RuntimeError("no node of the Slurm partition declares GPUs (Gres=gpu:N)")
        pool = self.pool
        if pool == SHARD_POOL and not all(shards_per_gpu(g) for g in gres):
            pool = WHOLE_POOL  # no shards configured: fractions take whole GPUs
        milli = spec.gpu_milli
        if pool == WHOLE_POOL and milli % MILLI_PER_GPU:
            milli = -(-milli // MILLI_PER_GPU) * MILLI_PER_GPU
        # The largest request over the nodes: every rank gets at least its share.
        per_rank = max(
            (gres_request(milli, g, pool) for g in gres), key=lambda r: int(r.split(":")[1])
        )
        kind, count = per_rank.split(":")
        return [f"--gres={kind}:{int(count) * spec.nproc_per_node}"]

    async def start(self, spec: JobSpec, allocations: list[dict]) -> None:
        jd = self.jobdir(spec.id)
        os.makedirs(jd.p("logs"), exist_ok=True)
        jd.write_rdzv_secret()  # made at submit; a job queued before gpulab made one gets one
        account = await owner_account(self.accounts, self.python, self.jobs_root, spec.user, jd)
        # Which Slurm node each node rank runs on: where the ledger put its ranks.
        by_rank = {int(a["owner"].rsplit("/", 1)[1]): a for a in allocations}
        placed: list[str] = []
        gpus_of: list[list[str]] = []
        for node in range(spec.nodes):
            ranks = range(node * spec.nproc_per_node, (node + 1) * spec.nproc_per_node)
            names = [by_rank[r].get("node") for r in ranks if r in by_rank]
            placed.append(names[0] if names and names[0] else "")
            gpus_of.append(
                [by_rank[r]["gpu_uuid"] for r in ranks if r in by_rank] if self.real_gpus else []
            )
        nodelist = placed if all(placed) and len(set(placed)) == spec.nodes else []
        if any(placed) and not nodelist:
            # The ledger placed slices of different node ranks on one node, which one
            # Slurm allocation cannot do: Slurm picks the nodes (same GRES per node).
            jd.event(
                f"the slices were placed on {', '.join(sorted(set(placed)))}; Slurm "
                f"chooses the {spec.nodes} nodes of the job"
            )
        os.makedirs(jd.p("slurm"), exist_ok=True)
        base = {
            **self._base_env(account.home if account else jd.path),
            **(account.env() if account else {}),
        }
        for node in range(spec.nodes):
            launch = render_node(
                spec,
                node,
                job_dir=jd.path,
                rdzv_host="@HEAD@",
                rdzv_port="@PORT@",  # node rank 0's launcher picks a free one
                local_addr="@SELF@",
                node_gpus=gpus_of[node],
                # The owner's own environment (what they `%pip install`ed), else gpulab's.
                launcher=torchrun_argv(user_python(account, self.python)),
            )
            # The agent's log and the ranks' kept under the cap (slurm_launch, the runner).
            caps = {"GPULAB_LOG_MAX_BYTES": str(self.log_max_bytes)}
            node_file = {"argv": launch.argv, "env": {**base, **launch.env, **caps}}
            self._write(jd, f"node{node}.json", node_file)
        self._write(jd, "nodes.json", {name: r for r, name in enumerate(nodelist)})
        head = nodelist[0] if nodelist else ""
        slurm_env = {"SLURM_CONF": self.site.slurm_conf} if self.site.slurm_conf else {}
        path = os.pathsep.join(p for p in (self.site.bin_dir, "/usr/bin:/bin") if p)
        script = "\n".join(
            [
                "#!/bin/sh",
                f"export PATH={shlex.quote(path)}",
                *(f"export {k}={shlex.quote(v)}" for k, v in slurm_env.items()),
                # The rendezvous host: node rank 0's node (the ledger's), else the first.
                "GPULAB_RDZV_HOST="
                + (
                    shlex.quote(head)
                    if head
                    else '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
                ),
                "export GPULAB_RDZV_HOST",
                "exec srun --export=ALL --kill-on-bad-exit=1 --ntasks-per-node=1 "
                + shlex.join([self.python, "-m", "gpulab.backend.slurm_launch", jd.path]),
                "",
            ]
        )
        self._write(jd, "batch.sh", script, raw=True)
        argv = [
            "sbatch",
            "--parsable",
            f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",
            f"--job-name=gpulab-{spec.id}",
            f"--comment=gpulab:{spec.id}",
            f"--chdir={jd.path}",
            f"--output={jd.p('logs', 'slurm-%j.out')}",
            "--export=NONE",
            *(await self._gres(spec, nodelist)),
        ]
        if nodelist:
            argv.append(f"--nodelist={','.join(nodelist)}")
        if self.site.partition:
            argv.append(f"--partition={self.site.partition}")
        if account is not None:
            argv += [f"--uid={account.uid}", f"--gid={account.gid}"]
        argv.append(jd.p("slurm", "batch.sh"))
        out = await self.site.run(argv)
        job_id = out.strip().split(";")[0]
        self._write(jd, "job_id", job_id + "\n", raw=True)
        jd.write_json(
            "launch.json",
            {
                "backend": self.name,
                "slurm_job_id": job_id,
                "started": time.time(),
                "nodelist": nodelist,
                "sbatch": argv,
            },
        )
        jd.event(f"Slurm job {job_id} submitted")

    def _write(self, jd, name: str, data, raw: bool = False) -> None:
        """A file of ``JOB/slurm/``: the service's, readable by the owner's group
        (the launcher runs as the owner), like the job dir's other inputs."""
        folder = jd.p("slurm")
        gid = os.stat(jd.path).st_gid  # the owner's group once handed over
        tmp = os.path.join(folder, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(data if raw else json.dumps(data, indent=1))
        if os.geteuid() == 0:
            os.chown(tmp, 0, gid)
            os.chown(folder, 0, gid)
        os.chmod(tmp, 0o750 if name.endswith(".sh") else 0o640)
        os.chmod(folder, 0o750)
        os.replace(tmp, os.path.join(folder, name))

    # -- watching --------------------------------------------------------------------------
    def _exit_codes(self, jd, nodes: int) -> list[int | None]:
        codes: list[int | None] = []
        for n in range(nodes):
            try:
                codes.append(int(jd.read_user(f"pids/node{n}.exit", limit=32).strip() or 1))
            except (OSError, ValueError):
                codes.append(None)
        return codes

    async def reattach(self, spec: JobSpec) -> bool:
        job_id = self.slurm_id(spec)
        if job_id is None:
            return False
        info = await self.site.job(job_id)
        return info is not None and info["state"] in ACTIVE_STATES

    async def poll(self, spec: JobSpec) -> JobStatus:
        jd = self.jobdir(spec.id)
        restarts = jd.restarts()
        job_id = self.slurm_id(spec)
        if job_id is None:
            return JobStatus("failed", message="the job was never submitted", restarts=restarts)
        codes = self._exit_codes(jd, spec.nodes)
        try:
            info = await self.site.job(job_id)
        except SlurmError as e:  # slurmctld unreachable for a moment: ask again later
            return JobStatus("running", restarts=restarts, message=str(e))
        state = info["state"] if info else "GONE"
        details = {"slurm_job_id": job_id, "slurm_state": state}
        if info and info.get("nodes"):
            details["slurm_nodes"] = info["nodes"]
        # The exit files are in a folder the job's ranks can write: they are believed
        # once Slurm says the allocation ended (a job could write 0s and train on,
        # its GPUs given back to gpulab while Slurm still held them for it).
        if all(c == 0 for c in codes) and state not in ACTIVE_STATES:
            return JobStatus("succeeded", exit_code=0, restarts=restarts, details=details)
        if state in ACTIVE_STATES and not any(c not in (None, 0) for c in codes):
            message = f"Slurm job {job_id} {state.lower()}"
            if state == "PENDING" and info.get("reason"):
                message += f" ({info['reason']})"
            return JobStatus("running", restarts=restarts, message=message, details=details)
        if state in ACTIVE_STATES:
            # One node failed; srun --kill-on-bad-exit ends the others. Wait for that.
            return JobStatus("running", restarts=restarts, details=details)
        code = next((c for c in codes if c not in (None, 0)), -9)
        ended = f"Slurm job {job_id} ended {state}"
        logs = [NODE0_LOG, f"logs/slurm-{job_id}.out"]
        return JobStatus(
            "failed", **failure(jd, spec.nodes, restarts, code, ended, logs, details=details)
        )

    # -- stopping --------------------------------------------------------------------------
    async def preempt(self, spec: JobSpec) -> None:
        """SIGTERM the ranks (they checkpoint at their next step and exit): a step of
        the job on each node runs the launcher's ``--signal TERM``, as the owner.
        ``scancel --signal`` would reach the torchrun agents too, which then stop
        their workers and fail. Returns once the step is submitted."""
        job_id = self.slurm_id(spec)
        if job_id is None:
            return
        argv = [
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",
            # Only what the launcher needs to start, never the service's variables.
            "--export=" + (",".join(k for k in PASS_ENV if k in os.environ) or "NONE"),
            self.python,
            "-m",
            "gpulab.backend.slurm_launch",
            "--signal",
            "TERM",
            self.jobdir(spec.id).path,
        ]
        account = self.accounts.lookup(spec.user) if self.accounts is not None else None
        # A job ending or pending has nothing to checkpoint: the grace's cancel follows.
        with contextlib.suppress(SlurmError):
            await self.site.run(argv, user=account.name if account else None, timeout=60)

    async def cancel(self, spec: JobSpec, grace_s: float | None = None) -> None:
        """``scancel``, then wait (``grace_s``, default CANCEL_WAIT_S) until ``squeue``
        no longer lists the job."""
        job_id = self.slurm_id(spec)
        if job_id is None:
            return
        await self.site.cancel(job_id)
        deadline = time.monotonic() + (CANCEL_WAIT_S if grace_s is None else grace_s)
        while time.monotonic() < deadline:
            info = await self.site.job(job_id)
            if info is None or info["state"] not in ACTIVE_STATES:
                return
            await asyncio.sleep(0.2)
