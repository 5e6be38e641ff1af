"""The local backend: torchrun processes on this machine (the embedded default).

Each node of the job is one torchrun agent in a session of its own
(``start_new_session``), so it outlives a restart of the service and a cancel
can signal its whole process group. The agent runs under ``/bin/sh``, which
writes torchrun's exit code to ``pids/node<N>.exit`` when it ends: a service that
re-attached (and so is not the parent) still learns how the job ended.
``launch.json`` holds the pids and process groups.

With per-user accounts each job's nodes run in a network namespace of the job's
own (:mod:`.job_network`, ``c.JobNetwork``): the rendezvous is on 127.0.0.1 there
and gloo on ``lo``, so nothing the job listens on is reachable from the host's
namespace or any other. The namespace goes when the job ends, fails or is cancelled.

With per-user accounts (:class:`gpulab.enforcement.accounts.UserAccounts`) the
agents and their ranks run as the job owner's account, with the owner's home,
and write only the folders :meth:`JobDir.hand_over` gives them.

On GPUs each rank gets its slice's card (``GPULAB_NODE_GPUS`` -> the rank sets
``CUDA_VISIBLE_DEVICES`` and a memory fraction); on CPU or simulated GPUs the
ranks run gloo.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import select
import signal
import socket
import subprocess
import time

from traitlets import Instance, Int, Unicode, default

from gpulab.enforcement.accounts import separated, unreachable
from gpulab.enforcement.environments import SiteEnvironments, job_environment
from gpulab.enforcement.gpu_nodes import no_gpu_unless
from gpulab.enforcement.slice_env import mps_client_env, mps_pipe_directory
from gpulab.enforcement.user_env import user_python
from gpulab.training.env import NODE_MEMORY_BYTES
from gpulab.training.memory import killed_line

from .base import Backend, JobStatus
from .failures import NODE0_LOG, failure
from .job_network import PRIVATE_RDZV_PORT, JobNetwork, Network
from .job_network import delete as delete_network
from .render import render_node, torchrun_argv
from .spec import JobSpec, SpecError

# What the ranks inherit from the service's environment; nothing else (the
# service's hub token and database URL must not reach user code).
PASS_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
)
# After one node's agent fails, how long the others get to notice before we stop them.
PEER_GRACE_S = 30.0
#: How long a cancelled job's processes get after SIGTERM before SIGKILL. Short: a
#: cancelled job does not resume, so it saves nothing, and ranks of the gpulab runner
#: read SIGTERM as "checkpoint at the next step" (a preemption's, which has its own
#: grace: c.JobQueue.preemption_grace_seconds), so they would wait out any grace.
CANCEL_GRACE_S = 2.0
_WRAPPER = (
    '"$@"; code=$?; echo $code > "$GPULAB_EXIT_FILE.tmp"; '
    'mv "$GPULAB_EXIT_FILE.tmp" "$GPULAB_EXIT_FILE"'
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def owner_account(accounts, python: str, jobs_root: str, user: str, jd):
    """The job owner's account (made if new), with the job dir ``jd`` handed over to
    it; None when accounts are off. Raises if that account could not run the ranks."""
    if accounts is None:
        return None
    problem = unreachable(python, execute=True) or unreachable(jobs_root)
    if problem:
        raise RuntimeError(f"the ranks cannot run as {user}'s account: {problem}")
    account = await asyncio.get_running_loop().run_in_executor(None, accounts.ensure, user)
    jd.hand_over(account.uid, account.gid)
    return account


def node_unit(spec: JobSpec, node: int) -> str:
    """The cgroup of one node of a job, under its owner's account's."""
    return f"job-{spec.id}-node{node}"


def process_alive(
    pid: int, marker: str, uid: int | None = None, members: set[int] | None = None
) -> bool:
    """Is ``pid`` still our process (it runs as ``uid`` when given: a pid read from a
    user's file must not lead the service to signal anyone else's process)? Ours: one
    of ``members`` (the pids of the job's cgroups) when given, else a process whose
    command line names ``marker`` (the job dir).

    A command line is the process's own memory, which its owner can make a read of
    block (backed by a FUSE file that never answers); the cgroup's list is the
    kernel's, so it is used wherever the job has cgroups."""
    try:
        if uid is not None and os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        if members is not None:
            return pid in members and _running(pid)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return _running(pid) and marker.encode() in cmd


class LocalBackend(Backend):
    """torchrun on the service's machine. Settings: ``c.JobNetwork`` (the nodes'
    network); the rest comes from the service (:mod:`.plugin`)."""

    name = "local"
    can_preempt = True
    runs_on_this_host = True

    home = Unicode(None, allow_none=True, help="The ranks' HOME; None: the job's folder.")
    gpu_count = Int(help="How many GPUs the machine has (the pool's).")
    network = Instance(JobNetwork, help="Which network each job's nodes run in.")

    @default("gpu_count")
    def _pool_size(self) -> int:
        return len(self.gpus)

    @default("network")
    def _job_network(self) -> JobNetwork:
        return JobNetwork(parent=self)

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        #: :class:`~gpulab.enforcement.accounts.UserAccounts` and the
        #: :class:`~gpulab.enforcement.account_limits.AccountLimits` for each node's
        #: ranks, or None: run as the service.
        self.accounts, self.limits = separated(self.root, self.accounts, self.limits)
        self._children: dict[str, list[subprocess.Popen]] = {}
        self._failed_since: dict[str, float] = {}

    def check(self, spec: JobSpec) -> None:
        if spec.comm_hook == "bf16" and not (self.real_gpus and spec.gpu_milli):
            raise SpecError(
                "comm hook bf16 needs NCCL, which needs GPUs; these ranks run gloo "
                "on CPU: use --comm-hook fp16 or powersgd"
            )

    # -- launching ----------------------------------------------------------------
    def _base_env(self, jobdir) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        env["HOME"] = self.home or jobdir.path
        return env

    def node_launches(
        self,
        spec: JobSpec,
        allocations: list[dict],
        port: int,
        private: bool = False,
        python: str | None = None,
    ):
        """Each node's launch; ``private``: in the job's own network namespace, where
        the agents' and the ranks' stores and gloo use its loopback (the host's name
        would resolve to an address the namespace does not have); ``python``: the
        ranks' interpreter (the owner's own environment), gpulab's by default."""
        jd = self.jobdir(spec.id)
        by_rank = {}
        for a in allocations:
            by_rank.setdefault(int(a["owner"].rsplit("/", 1)[1]), a["gpu_uuid"])
        for node in range(spec.nodes):
            ranks = range(node * spec.nproc_per_node, (node + 1) * spec.nproc_per_node)
            gpus = [by_rank[r] for r in ranks if r in by_rank] if self.real_gpus else []
            yield render_node(
                spec,
                node,
                job_dir=jd.path,
                rdzv_host="127.0.0.1",
                rdzv_port=port,
                local_addr="127.0.0.1" if private else None,
                ifname="lo" if private else None,
                node_gpus=gpus,
                launcher=torchrun_argv(python or self.python),
            )

    async def start(self, spec: JobSpec, allocations: list[dict]) -> None:
        jd = self.jobdir(spec.id)
        os.makedirs(jd.p("logs"), exist_ok=True)
        account = await owner_account(self.accounts, self.python, self.jobs_root, spec.user, jd)
        environment = None
        if spec.environment:  # the one the server it came from runs in
            environment = await asyncio.get_running_loop().run_in_executor(
                None, job_environment, SiteEnvironments(parent=self), spec.environment, account
            )
            jd.event(f"ranks run in the environment {spec.environment}")
        network = await asyncio.get_running_loop().run_in_executor(
            None, self.network.open, spec.id, account is not None, jd.p("network.log")
        )
        if network.note:
            jd.event(network.note)
        try:
            self._launch(spec, allocations, jd, account, network, environment)
        except BaseException:
            # Nothing of a half-made start stays: the agents it made, their groups,
            # the job's network.
            for proc in self._children.pop(spec.id, []):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            await self._release(spec)
            raise

    def _launch(
        self,
        spec: JobSpec,
        allocations: list[dict],
        jd,
        account,
        network: Network,
        environment: tuple[str, dict[str, str]] | None = None,
    ):
        port = PRIVATE_RDZV_PORT if network.private else free_port()
        nodes = []
        procs = []
        self._children[spec.id] = procs
        python = user_python(account, self.python)  # what the owner `%pip install`ed too
        if environment is not None:  # the site's environment, the owner's layer over it
            python = environment[0]
        for launch in self.node_launches(spec, allocations, port, network.private, python):
            env = {
                **self._base_env(jd),
                **(account.env() if account else {}),
                **(mps_client_env(mps_pipe_directory()) if self.real_gpus else {}),
                **launch.env,
                **(environment[1] if environment is not None else {}),
                "GPULAB_EXIT_FILE": jd.p("pids", f"node{launch.node_rank}.exit"),
                "GPULAB_LOG_MAX_BYTES": str(self.log_max_bytes),  # the ranks' logs too
            }
            argv = self._node_argv(jd, launch.node_rank, launch.argv)
            run_as = account.popen_kwargs() if account else {}
            group = self._node_group(spec, account, launch.node_rank, allocations)
            if group is not None:
                argv, run_as = group.launch(argv, **run_as)
                if group.limits.memory_bytes:  # ranks cannot read their group (0700)
                    env[NODE_MEMORY_BYTES] = str(group.limits.memory_bytes)
            log = jd.open_user(
                f"logs/node{launch.node_rank}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT
            )
            try:
                proc = network.popen(
                    argv,
                    env=env,
                    cwd=jd.path,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **run_as,
                )
            finally:
                os.close(log)
            procs.append(proc)
            nodes.append(
                {"node": launch.node_rank, "pid": proc.pid, "pgid": proc.pid, "argv": launch.argv}
            )
        jd.write_json(
            "launch.json",
            {
                "backend": self.name,
                "rdzv_port": port,
                "network": network.record(),
                "started": time.time(),
                "nodes": nodes,
            },
        )

    def _node_argv(self, jd, node: int, agent: list[str]) -> list[str]:
        """The agent under its log writer (:mod:`gpulab.training.log_cap`), which keeps
        ``logs/node<N>.log`` under ``log_max_bytes`` and writes the exit code once all
        the agent's output is in the log; under ``/bin/sh`` when logs are not capped."""
        if not self.log_max_bytes:
            return ["/bin/sh", "-c", _WRAPPER, "gpulab-node", *agent]
        return [
            *(self.python, "-m", "gpulab.training.log_cap"),
            *("--max-bytes", str(self.log_max_bytes)),
            *("--exit-file", jd.p("pids", f"node{node}.exit")),
            jd.p("logs", f"node{node}.log"),
            "--",
            *agent,
        ]

    def _node_group(self, spec: JobSpec, account, node: int, allocations: list[dict]):
        """The cgroup of one node's agent and ranks (the limits of its ranks' slices)."""
        if self.limits is None or account is None:
            return None
        real = (
            sorted({a["gpu_uuid"] for a in allocations if a.get("gpu_uuid")})
            if self.real_gpus
            else []
        )
        # A CPU-only job on a host with real cards opens none of them.
        devices = no_gpu_unless(real, self.real_gpus)
        return self.limits.group(
            account.name,
            node_unit(spec, node),
            spec.gpu_milli,
            self.gpu_count,
            ranks=spec.nproc_per_node,
            gpu_devices=devices,
        )

    async def _release(self, spec: JobSpec) -> None:
        """What the job held on the host once its processes are gone: its nodes'
        cgroups and its network namespace (found by the job's id: a service that
        re-attached, or a start that failed half-way, has the same)."""
        if self.limits is not None:
            account = self.accounts.lookup(spec.user)
            if account is not None:
                for node in range(spec.nodes):
                    self.limits.remove(account.name, node_unit(spec, node))
        if self.accounts is not None:
            await asyncio.get_running_loop().run_in_executor(None, delete_network, spec.id)

    # -- watching -----------------------------------------------------------------
    def _reap(self, job_id: str) -> None:
        for p in self._children.get(job_id, []):
            p.poll()

    def _node_states(self, spec: JobSpec) -> list[int | None]:
        """Exit code per node; None while it runs; -9 if it vanished without one."""
        jd = self.jobdir(spec.id)
        self._reap(spec.id)
        launch = jd.read_json("launch.json", {}) or {}
        ours = {p.pid: p for p in self._children.get(spec.id, [])}
        states = []
        uid = jd.owner()[0]
        members = self._job_members(spec)
        for node in launch.get("nodes", []):
            exit_file = f"pids/node{node['node']}.exit"
            try:
                states.append(int(jd.read_user(exit_file, limit=32).strip() or 1))
                continue
            except (OSError, ValueError):
                pass
            child = ours.get(node["pid"])
            # Our own child is asked directly: right after fork its command line
            # is still ours, so the marker test below would call it dead.
            if (
                (child.poll() is None)
                if child
                else process_alive(node["pid"], jd.path, uid, members)
            ):
                states.append(None)
            else:
                # The exit file is written right after torchrun ends; give it a look again.
                states.append(-9 if not os.path.exists(jd.p(exit_file)) else 1)
        return states

    async def reattach(self, spec: JobSpec) -> bool:
        return any(s is None for s in self._node_states(spec))

    async def poll(self, spec: JobSpec) -> JobStatus:
        jd = self.jobdir(spec.id)
        states = self._node_states(spec)
        restarts = jd.restarts()
        if not states:
            await self._release(spec)
            return JobStatus("failed", message="the job was never started", restarts=restarts)
        if any(s is None for s in states):
            if any(s not in (None, 0) for s in states):
                first = self._failed_since.setdefault(spec.id, time.monotonic())
                if time.monotonic() - first > PEER_GRACE_S:
                    await self.cancel(spec)
            return JobStatus("running", restarts=restarts)
        self._failed_since.pop(spec.id, None)
        self._children.pop(spec.id, None)
        oom = self._oom_kills(spec) if any(s != 0 for s in states) else None
        await self._release(spec)
        if all(s == 0 for s in states):
            return JobStatus("succeeded", exit_code=0, restarts=restarts)
        code = next(s for s in states if s != 0)
        ended = f"torchrun exited with code {code}"
        info = failure(jd, len(states), restarts, code, ended, [NODE0_LOG])
        if oom is not None:  # the kernel killed a rank: say so, not "Signal 9"
            node, cap = oom
            error = info.get("error") or {}
            line = killed_line(error.get("rank"), node, cap, spec.nproc_per_node)
            info["message"] = line
            if error:
                info["error"] = {**error, "message": line}
        return JobStatus("failed", **info)

    def _oom_kills(self, spec: JobSpec) -> tuple[int, int | None] | None:
        """(node, its group's memory cap) of the first node whose group saw the kernel's
        OOM killer, read before the groups go; None when none did."""
        if self.limits is None:
            return None
        account = self.accounts.lookup(spec.user)
        if account is None:
            return None
        for node in range(spec.nodes):
            with contextlib.suppress(Exception):  # a host that cannot say: no line
                group = self.limits.cgroups().open(f"{account.name}/{node_unit(spec, node)}")
                events = group.memory_events()
                if events.get("oom_kills"):
                    return node, events.get("limit")
        return None

    def _job_members(self, spec: JobSpec) -> set[int] | None:
        """The pids in the job's nodes' cgroups, as the kernel lists them; None where
        its nodes have none (no limits, a host without a mechanism, a group the host
        refused: such nodes run unlimited, see ``AccountLimits.group``)."""
        if self.limits is None or self.accounts is None:
            return None
        cgroups = self.limits.cgroups()
        account = self.accounts.lookup(spec.user)
        if cgroups.kind == "none" or account is None:
            return None
        groups = [
            cgroups.open(f"{account.name}/{node_unit(spec, node)}") for node in range(spec.nodes)
        ]
        if not any(g.exists() for g in groups):
            return None
        return {pid for g in groups for pid in g.pids()}

    # -- stopping -----------------------------------------------------------------
    def _rank_pidfds(self, spec: JobSpec) -> dict[int, int]:
        """The job's live ranks, pid -> pidfd. Each pidfd is opened before its process
        is checked (the job's account; in the job's cgroups, or else a command line
        naming the job): a signal sent through it reaches that process or none, never
        one that took its pid since. The caller closes them (:func:`_close_all`)."""
        # torchrun starts each worker in a session of its own, so signalling the
        # agent's group does not reach them; the ranks record their pids.
        jd = self.jobdir(spec.id)
        fds: dict[int, int] = {}
        uid = jd.owner()[0]
        members = self._job_members(spec)
        for path in glob.glob(jd.p("pids", "rank*.json")):
            info = jd.read_user_json(os.path.relpath(path, jd.path))
            pid = info.get("pid") if isinstance(info, dict) else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pid in fds:
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            if process_alive(pid, jd.path, uid, members):
                fds[pid] = fd
            else:
                os.close(fd)
        return fds

    async def preempt(self, spec: JobSpec) -> None:
        """Ask the ranks to stop at their next step boundary (SIGTERM; they checkpoint).

        The ranks, not the agents: torchrun would stop its workers and fail. Before
        the ranks have started there is nothing to save: the agents stop them.
        """
        jd = self.jobdir(spec.id)
        ranks = self._rank_pidfds(spec)
        if ranks:
            _signal_all(ranks, signal.SIGTERM)
            _close_all(ranks)
            return
        launch = jd.read_json("launch.json", {}) or {}
        for node in launch.get("nodes", []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node["pgid"], signal.SIGTERM)

    async def cancel(self, spec: JobSpec, grace_s: float | None = None) -> None:
        """SIGTERM the agents (they stop their workers), then SIGKILL whatever is left
        after ``grace_s`` (default CANCEL_GRACE_S)."""
        grace_s = CANCEL_GRACE_S if grace_s is None else grace_s
        jd = self.jobdir(spec.id)
        launch = jd.read_json("launch.json", {}) or {}
        groups = [n["pgid"] for n in launch.get("nodes", [])]
        # A rank seen once stays watched until it is gone: a process tearing down
        # its memory after SIGKILL already reads an empty command line, so it is no
        # longer found while it still runs.
        ranks = self._rank_pidfds(spec)
        try:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                for pgid in groups:
                    # A group that is gone may have given its id to another by now.
                    if sig == signal.SIGTERM or _group_alive(pgid):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pgid, sig)
                if sig == signal.SIGKILL:
                    _merge(ranks, self._rank_pidfds(spec))
                    _signal_all(ranks, signal.SIGKILL)
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    self._reap(spec.id)
                    _merge(ranks, self._rank_pidfds(spec))
                    _drop_ended(ranks)
                    if not any(_group_alive(g) for g in groups) and not ranks:
                        self._children.pop(spec.id, None)
                        await self._release(spec)
                        return
                    await asyncio.sleep(0.1)
            self._reap(spec.id)
            self._children.pop(spec.id, None)
            await self._release(spec)
        finally:
            _close_all(ranks)


def _signal_all(fds: dict[int, int], sig: int) -> None:
    for fd in fds.values():
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, sig)


def _ended(fd: int) -> bool:
    """Has the process of a pidfd ended (a pidfd polls readable once it has)?"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _merge(into: dict[int, int], found: dict[int, int]) -> None:
    """Add the ranks in ``found`` not watched yet; close the pidfds already held."""
    for pid, fd in found.items():
        if pid in into:
            os.close(fd)
        else:
            into[pid] = fd


def _drop_ended(fds: dict[int, int]) -> None:
    for pid in [p for p, fd in fds.items() if _ended(fd)]:
        os.close(fds.pop(pid))


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, the
    process group third), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _running(pid: int) -> bool:
    """Does ``pid`` exist and is it not a zombie?"""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
