"""FractionalLocalSpawner: a local JupyterLab process held to a GPU slice.

Use it with ``c.JupyterHub.spawner_class = "gpulab-local"``. On start it asks
the gpulab service for a slice (``user_options = {"gpu_milli": 250}``), then
starts the server with the slice in its environment (see
:mod:`.enforcement`). Stop, a failed start and idle culling (which stops the
server) give the slice back.

When the hub runs as root (and ``c.UserAccounts.enabled``, the default then),
each user's server runs as a Unix account of their own (``gpulab-<name>``,
created on first spawn, see :mod:`gpulab.enforcement.accounts`) with a ``0700``
home: kernels, terminals and everything they start cannot read or signal
another user's. Otherwise servers run as the hub's own account, like
JupyterHub's ``SimpleLocalProcessSpawner``: fine for one person's workstation.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from jupyterhub.utils import maybe_future
from tornado import web
from traitlets import Float, default

from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.accounts import unreachable
from gpulab.enforcement.gpu_nodes import no_gpu_unless
from gpulab.enforcement.slice_env import mps_pipe_directory, slice_env
from gpulab.scheduler.slices import label

from .host import FractionalHostSpawner
from .placement import STARTING_LAB, local_enforcement
from .server_certs import hand_over
from .user_options import parse_user_options

__all__ = ["FractionalLocalSpawner", "parse_user_options"]


class FractionalLocalSpawner(FractionalHostSpawner, SimpleLocalProcessSpawner):
    """A JupyterLab server as a child process of the hub, held to its slice (and, with
    per-user accounts, to the slice's CPU and memory by a cgroup).

    It takes ``c.FractionalHostSpawner.*`` (what it shares with the Slurm spawner:
    the gpulab service, the kernel folder, the cache) and its own
    ``c.FractionalLocalSpawner.*``, JupyterHub's ``SimpleLocalProcessSpawner``'s too.
    """

    def form_limits(self, availability, inventory):
        if not self._accounts().enabled:
            return None
        gpu_count = sum(len(n["gpus"]) for n in inventory["nodes"])
        held = AccountLimits(config=self.config)
        return {
            s["milli"]: held.cgroups().in_words(held.limits(s["milli"], gpu_count))
            for s in availability["sizes"]
        }

    @default("popen_kwargs")
    def _no_terminal(self):
        # Not the hub's stdin: with `gpulab up` in the foreground that is the operator's
        # terminal, which the user's server, kernels and subprocesses then held open
        # (they could read what the operator types there).
        return {"stdin": subprocess.DEVNULL}

    #: The first wait before looking whether a stopping server has exited (doubling
    #: from there): JupyterHub's 0.1 s noticed a server that exits in 1.6 s at 3.1 s.
    death_interval = Float(0.01)

    async def poll(self):
        # A server adopted after a hub restart is not the hub's child: once it exits it
        # stays a zombie until its new parent (init) reaps it, which JupyterHub's
        # signal 0 takes for a running server, and a stop waited on it for seconds.
        if self.proc is None and self.pid and _is_zombie(self.pid):
            self.clear_state()
            return 0
        return await super().poll()

    #: This server's cgroup under its account; unique per start, kept in the hub's
    #: state so a restarted hub still removes it.
    _unit: str = ""
    #: The cgroup of a server whose state was cleared before its stop removed it:
    #: JupyterHub's ``poll()`` clears the state the moment it sees the process gone,
    #: within ``stop()`` and when the server died on its own.
    _unit_left: str = ""

    # -- who the server runs as ---------------------------------------------------------
    def make_preexec_fn(self, name):
        if self.account is None:
            return super().make_preexec_fn(name)
        # An account is set by Popen's own user/group arguments (popen_kwargs).
        return None

    def user_env(self, env):
        if self.account is None:
            return super().user_env(env)
        env.update(self.account.env())
        return env

    def get_args(self):
        args = super().get_args()
        if self.account is None and os.geteuid() == 0:
            args.append("--allow-root")  # only when nobody is separated anyway
        return args

    async def start(self):
        self.begin_progress()
        milli = parse_user_options(self.user_options)
        self.chosen_environment()  # an unknown one is a 400 before a slice is taken
        allocations = await self._allocate(milli)
        simulated = any(a.get("simulated") for a in allocations)
        mps_dir = mps_pipe_directory()
        self._slice = slice_env(allocations, simulated, mps_dir)
        self.log.info(
            "%s holds %s on %s",
            self._owner,
            label(milli),
            self._slice.get("GPULAB_GPU_UUID") or "no GPU",
        )
        try:
            await self.show_placement(milli, allocations)
            accounts = self._accounts()
            if accounts.enabled:
                problem = unreachable(
                    self.cmd[0] if os.path.isabs(self.cmd[0]) else sys.executable, execute=True
                )
                if problem:
                    raise web.HTTPError(
                        500, f"{self.user.name}'s account cannot start JupyterLab: {problem}"
                    )
                self.account = await self._ensure_account(accounts)
                await self._hold_to_limits(milli, allocations)
                await self._give_examples()
                await self._make_user_env()
            await self._prepare_environment()
            self.report_progress(
                50,
                local_enforcement(
                    allocations, simulated, bool(mps_dir), self._slice.get("GPULAB_LIMITS", "")
                ),
            )
            self._write_kernelspec()
            self.report_progress(60, STARTING_LAB)
            return await super().start()
        except BaseException:
            await self._remove_group()
            await self._release()
            raise

    async def move_certs(self, paths):
        """With per-user accounts, the server's TLS files (internal_ssl) become its
        account's to read (:mod:`.server_certs`); else the hub's account runs it and
        reads them where they are."""
        accounts = self._accounts()
        if not accounts.enabled:
            return paths
        account = await self._ensure_account(accounts)
        return await asyncio.get_running_loop().run_in_executor(
            None, hand_over, paths, account, self._certs_folder()
        )

    def _certs_folder(self) -> Path:
        server = f"named-{self.name}" if self.name else "default"
        return Path(self.internal_certs_location).parent / "servers" / self.user.name / server

    def get_state(self):
        state = super().get_state()
        if self._unit:
            state["gpulab_unit"] = self._unit
        return state

    def load_state(self, state):
        super().load_state(state)
        self._unit = state.get("gpulab_unit", "")

    def clear_state(self):
        super().clear_state()
        self._unit_left = self._unit or self._unit_left
        self._unit = ""

    async def _hold_to_limits(self, milli: int, allocations: list[dict]) -> None:
        """Start the server as its account, inside a cgroup with the slice's CPU,
        memory and (real GPUs) device limits."""
        limits = AccountLimits(config=self.config)
        real = [a["gpu_uuid"] for a in allocations if a.get("gpu_uuid") and not a.get("simulated")]
        inventory = await self._client().request("GET", "/inventory")
        gpu_count = sum(len(n["gpus"]) for n in inventory["nodes"])
        cards = [g for n in inventory["nodes"] for g in n["gpus"]]
        # On a host with real cards, a server without a slice opens none of them
        # (None would leave devices unlimited: every card, and no slice held).
        devices = no_gpu_unless(real, any(not g.get("simulated") for g in cards))
        self._unit = f"server-{self.name or 'default'}-{secrets.token_hex(4)}"
        group = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: limits.group(
                self.account.name, self._unit, milli, gpu_count, gpu_devices=devices
            ),
        )
        # What the operator configured, kept: each start builds on it afresh.
        if not hasattr(self, "_configured"):
            self._configured = (list(self.cmd), dict(self.popen_kwargs))
        cmd, popen_kwargs = self._configured
        argv, kwargs = list(cmd), self.account.popen_kwargs()
        if group is not None:
            argv, kwargs = group.launch(argv, **kwargs)
            self._slice["GPULAB_LIMITS"] = group.describe()
        self.cmd = argv
        self.popen_kwargs = {**popen_kwargs, **kwargs, "cwd": self.account.home}

    async def _remove_group(self) -> None:
        unit = self._unit or self._unit_left
        if not unit:
            return
        accounts = self._accounts()
        # After a hub restart this spawner never started: find the account again.
        account = self.account or (accounts.lookup(self.user.name) if accounts.enabled else None)
        if account is not None:
            limits = AccountLimits(config=self.config)
            await asyncio.get_running_loop().run_in_executor(
                None, limits.remove, account.name, unit
            )
        self._unit_left = ""

    async def run_post_stop_hook(self):
        # Every stop ends here, also that of a server found dead, for which JupyterHub
        # never calls stop(): its cgroup goes too.
        try:
            await self._remove_group()
        finally:
            await maybe_future(super().run_post_stop_hook())

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self._remove_group()
            if self.internal_ssl:  # the next start is handed a new pair
                shutil.rmtree(self._certs_folder(), ignore_errors=True)


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (state Z in /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # "pid (comm) state ...": comm may hold spaces and parentheses.
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False
