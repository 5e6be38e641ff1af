"""Model-server replicas as processes on this machine: starting, finding and killing them.

Each replica is ``python -m gpulab.serving.server`` in a session of its own
(``start_new_session``), so it outlives a restart of the service, which then
finds it again by its pid and the deployment directory in its command line.
A deployment's directory holds::

    model/            model.pt2 + model.json (gpulab.serving.export)
    token             the secret the replicas want in ``Authorization: Bearer``
    replica<N>.json   {"pid", "socket", "started"} of the replica's latest process
    logs/replica<N>.log

The replicas listen on Unix sockets the service binds in a folder only its own
account (root) enters (:mod:`.replica_sockets`): no other account of the host can
connect to them, behind the service's authenticated endpoint. Their token is a
second lock (defense in depth). A record of an older service that names a
``port`` instead is still followed (``http://127.0.0.1:<port>``).

With per-user accounts the replicas run as the owner's account: the directory
is ``root:<owner's group> 0750``, the model readable by that group, and the
token and logs root's alone (a replica gets its token in its environment,
which only its own account can read).

Keeping them running (restarts, the crash window) is :mod:`.local_serving`'s part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import time

from traitlets import Int, default

from gpulab.enforcement.accounts import separated
from gpulab.enforcement.gpu_nodes import no_gpu_unless
from gpulab.enforcement.slice_env import mps_client_env, mps_pipe_directory
from gpulab.enforcement.user_env import user_python

from .deployment_dir import ADAPTERS_DIR, HF_DIR
from .local import PASS_ENV, process_alive
from .log_pipe import capped_log
from .replica_http import unix_address
from .replica_sockets import ReplicaSockets
from .serving_base import ServingBackend

#: The nice value of a replica until it answers ready (0: none).
STARTING_NICE = 10


def _ended(pidfd: int) -> bool:
    """Has the process of a pidfd exited (a pidfd polls readable once it has)?"""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def replica_unit(dep_id: str, replica: int) -> str:
    """The name of a replica's cgroup under its owner's account."""
    return f"deploy-{dep_id}-r{replica}"


class LocalReplicas(ServingBackend):
    """The replica processes of every deployment under ``root``."""

    gpu_count = Int(help="How many GPUs the machine has (the pool's).")

    @default("gpu_count")
    def _pool_size(self) -> int:
        return len(self.gpus)

    def __init__(self, root: str | None = None, **kwargs):
        super().__init__(root, **kwargs)
        #: :class:`~gpulab.enforcement.accounts.UserAccounts` and the
        #: :class:`~gpulab.enforcement.account_limits.AccountLimits` for each replica,
        #: or None: run as the service.
        self.accounts, self.limits = separated(self.root, self.accounts, self.limits)
        self._writers: list[subprocess.Popen] = []
        self.sockets = ReplicaSockets(self.root)
        self._children: dict[tuple[str, int], subprocess.Popen] = {}

    # -- the directory -----------------------------------------------------------
    def prepare(self, dep_id: str) -> str:
        os.makedirs(self.path(dep_id, "logs"), exist_ok=True)
        return super().prepare(dep_id)

    def _hand_over(self, dep_id: str, gid: int) -> None:
        """Let the owner's account (group ``gid``) read the model, and nobody else."""
        model = self.model_dir(dep_id)
        folders = [model]
        if os.path.isdir(os.path.join(model, HF_DIR)):  # a language model's files
            folders.append(os.path.join(model, HF_DIR))
        adapters = os.path.join(model, ADAPTERS_DIR)
        if os.path.isdir(adapters):  # its LoRA adapters, a folder each
            folders.append(adapters)
            folders += [os.path.join(adapters, name) for name in sorted(os.listdir(adapters))]
        for folder in folders:
            for name in os.listdir(folder):
                if os.path.isfile(os.path.join(folder, name)):
                    os.chown(os.path.join(folder, name), 0, gid)
                    os.chmod(os.path.join(folder, name), 0o640)
        for path in (*folders[1:], model, self.path(dep_id)):
            os.chown(path, 0, gid)
            os.chmod(path, 0o750)

    def remove(self, dep_id: str) -> None:
        self.sockets.remove(dep_id)
        super().remove(dep_id)

    # -- replicas ----------------------------------------------------------------
    def start_replica(self, dep: dict, replica: int, gpu_uuid: str | None = None) -> dict:
        """Launch one replica on its socket; returns its record (pid, socket)."""
        dep_id = dep["id"]
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        run_as, group, account = {}, None, None
        env.update(HOME=self.path(dep_id))
        if self.accounts is not None:
            account = self.accounts.ensure(dep["user"])
            self._hand_over(dep_id, account.gid)
            env.update(account.env())
            run_as = account.popen_kwargs()
            if self.limits is not None:
                # A CPU-only replica on a host with real cards opens none of them.
                devices = no_gpu_unless([gpu_uuid] if gpu_uuid else [], self.real_gpus)
                group = self.limits.group(
                    account.name,
                    replica_unit(dep_id, replica),
                    dep["gpu_milli"],
                    self.gpu_count,
                    gpu_devices=devices,
                )
        env.update(
            PYTHONUNBUFFERED="1",
            GPULAB_SERVING_TOKEN=self.token(dep_id),
            # The slice's card, or none: a CPU replica must not grab a GPU.
            CUDA_VISIBLE_DEVICES=gpu_uuid if (self.real_gpus and gpu_uuid) else "",
        )
        if self.real_gpus:
            env.update(mps_client_env(mps_pipe_directory()))
        if self.real_gpus and gpu_uuid and 0 < dep["gpu_milli"] < 1000:
            env["PYTORCH_CUDA_ALLOC_CONF"] = (
                f"per_process_memory_fraction:{dep['gpu_milli'] / 1000:g}"
            )
        path = self.sockets.path(dep_id, replica)
        # Bound here, listened on by the replica once it serves; our copy closes right
        # after the start (a dead replica's socket must refuse connections, not queue them).
        with self.sockets.bind(dep_id, replica) as sock:
            argv = [
                # The owner's own environment (a model's packages they installed), else gpulab's.
                user_python(account, self.python),
                "-m",
                "gpulab.serving.server",
                "--model-dir",
                self.model_dir(dep_id),
                "--listen-fd",
                str(sock.fileno()),
                "--max-batch-size",
                str(dep["max_batch_size"]),
                "--max-latency-ms",
                f"{dep['max_latency_ms']:g}",
                "--max-queue",
                str(dep["max_queue"]),
            ]
            if group is not None:
                argv, run_as = group.launch(argv, **run_as)
            with open(self.log_path(dep_id, replica), "ab") as log:
                log.write(f"[gpulab] starting replica {replica} on unix:{path}\n".encode())
            log = self._log(dep_id, replica)
            try:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=self.path(dep_id),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(sock.fileno(),),
                    **run_as,
                )
            finally:
                os.close(log)
        self._children[(dep_id, replica)] = proc
        if STARTING_NICE and os.geteuid() == 0:
            # Starting (imports, loading the model) at a lower priority, so a replica
            # being added does not take the CPU from those answering calls; back to
            # normal once it answers ready (``serving_priority``). Only root may raise it
            # again, so only root lowers it. The whole group: threads inherit it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PGRP, proc.pid, STARTING_NICE)
        record = {"pid": proc.pid, "socket": path, "started": time.time()}
        if group is not None:
            # The replica is known by its group's processes after a service restart.
            record["group"] = f"{account.name}/{replica_unit(dep_id, replica)}"
        tmp = self.path(dep_id, f"replica{replica}.json.tmp")
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path(dep_id, f"replica{replica}.json"))
        return record

    @staticmethod
    def serving_priority(pid: int) -> None:
        """A replica answers ready: back to the normal CPU priority, every thread."""
        if STARTING_NICE and os.geteuid() == 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.setpriority(os.PRIO_PGRP, pid, 0)

    def record(self, dep_id: str, replica: int) -> dict | None:
        try:
            with open(self.path(dep_id, f"replica{replica}.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    @staticmethod
    def address(record: dict) -> str:
        """Where the replica of ``record`` answers: ``unix:<socket>``, or the port on
        127.0.0.1 of a replica an older service started."""
        if "socket" in record:
            return unix_address(record["socket"])
        return f"http://127.0.0.1:{int(record['port'])}"

    def alive(self, dep_id: str, replica: int) -> bool:
        rec = self.record(dep_id, replica)
        if rec is None:
            return False
        child = self._children.get((dep_id, replica))
        if child is not None and child.pid == rec["pid"]:
            # Our own child is asked directly (this also reaps it when it died).
            return child.poll() is None
        return process_alive(rec["pid"], self.model_dir(dep_id), members=self._members(rec))

    def _members(self, rec: dict) -> set[int] | None:
        """The pids in the replica's cgroup, as the kernel lists them: its command line
        is the replica's own memory, which the owner's code in it can make a read of
        block. None where the replica has no group (it is known by its command line)."""
        name = rec.get("group")
        if not name or self.limits is None:
            return None
        cgroups = self.limits.cgroups()
        if cgroups.kind == "none":
            return None
        group = cgroups.open(name)
        return set(group.pids()) if group.exists() else None

    def _leaders(self, dep_id: str, replicas: range) -> list[tuple[int, int]]:
        """``(pid, pidfd)`` of each live replica's process (its group's leader). Each
        pidfd is opened before the process is checked to be the replica, so it stands
        for that process or none, never one that takes its pid later. The caller
        closes them."""
        leaders = []
        for i in replicas:
            rec = self.record(dep_id, i)
            pid = rec.get("pid") if isinstance(rec, dict) else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            if self.alive(dep_id, i):
                leaders.append((pid, fd))
            else:
                os.close(fd)
        return leaders

    def exit_code(self, dep_id: str, replica: int) -> int | None:
        child = self._children.get((dep_id, replica))
        return child.poll() if child is not None else None

    def _log(self, dep_id: str, replica: int) -> int:
        """The replica's stdout: a pipe into its capped log, written as the service
        (the log is root's); finished writers are reaped here."""
        path = self.log_path(dep_id, replica)
        if not self.log_max_bytes:
            return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._writers = [w for w in self._writers if w.poll() is None]
        env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
        return capped_log(path, self.log_max_bytes, self.python, env, None, self._writers)

    def log_path(self, dep_id: str, replica: int) -> str:
        return self.path(dep_id, "logs", f"replica{replica}.log")

    def log_tail(self, dep_id: str, replica: int, lines: int = 5) -> str:
        """The last ``lines`` lines of a replica's log, on one line (for messages)."""
        try:
            with open(self.log_path(dep_id, replica), "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - (64 << 10)))  # the end is enough
                text = f.read().decode(errors="replace")
            tail = [ln.rstrip() for ln in text.splitlines()[-lines:] if ln.strip()]
        except OSError:
            return ""
        return " | ".join(tail)

    async def suspend(self, dep: dict, grace_s: float) -> None:
        # Their records go: the next start launches them as never launched, not crashed.
        await self.kill(dep, range(dep["replicas"]), grace_s=grace_s)

    async def kill(
        self, dep: dict, replicas: range, grace_s: float = 10.0, drained: bool = False
    ) -> None:
        """SIGTERM the ``replicas`` (queued requests are answered), then SIGKILL; their
        records go (a scaled-away replica is not looked for again). ``drained``: they
        hold no request, so SIGKILL at once (an interpreter's orderly exit costs CPU the
        replicas still serving need)."""
        dep_id = dep["id"]
        leaders = self._leaders(dep_id, replicas)
        steps = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0))
        try:
            for sig, wait in steps[1:] if drained else steps:
                for pid, fd in leaders:
                    # Looked at again before each signal: a replica that exited since
                    # (during the grace period) may have given its pid to another
                    # process by now. While its leader lives, its group is its own.
                    if _ended(fd):
                        continue
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, sig)
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(fd, sig)  # one that left its group too
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:
                    if not any(self.alive(dep_id, i) for i in replicas):
                        break
                    await asyncio.sleep(0.1)
                else:
                    continue
                break
        finally:
            for _, fd in leaders:
                os.close(fd)
        for i in replicas:
            self._children.pop((dep_id, i), None)
            self.sockets.unlink(dep_id, i)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(dep_id, f"replica{i}.json"))
        account = self.accounts.lookup(dep["user"]) if self.limits is not None else None
        if account is not None:
            for i in replicas:
                self.limits.remove(account.name, replica_unit(dep_id, i))
