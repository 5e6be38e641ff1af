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
import json
import os
import secrets
import sys

from jupyterhub.spawner import SimpleLocalProcessSpawner
from tornado import web
from traitlets import Unicode, default

from gpulab.enforcement.account_limits import AccountLimits
from gpulab.enforcement.accounts import Account, UserAccounts, unreachable
from gpulab.enforcement.gpu_nodes import device_paths_for_uuids
from gpulab.enforcement.slice_env import mps_pipe_directory, slice_env, strip_enforcement_vars
from gpulab.scheduler.slices import SliceError, label, parse_gpu_milli

from .form import render_form
from .placement import STARTING_LAB, local_enforcement, placement_of
from .service_traits import GpuLabServiceMixin


def _bad_options(message: str) -> web.HTTPError:
    return web.HTTPError(400, f"invalid user_options: {message}")


def parse_user_options(options: object) -> int:
    """``{"gpu_milli": N}`` -> N; anything else is a 400 that says what is wrong."""
    if options is None:
        return 0
    if not isinstance(options, dict):
        raise _bad_options('expected a JSON object like {"gpu_milli": 250}')
    unknown = set(options) - {"gpu_milli"}
    if unknown:
        raise _bad_options(
            f"unknown option(s) {', '.join(sorted(map(str, unknown)))}; "
            f'the only option is "gpu_milli" (e.g. {{"gpu_milli": 250}})'
        )
    try:
        return parse_gpu_milli(options.get("gpu_milli", 0))
    except SliceError as e:
        raise _bad_options(str(e)) from None


class FractionalLocalSpawner(GpuLabServiceMixin, SimpleLocalProcessSpawner):
    kernel_dir = Unicode(
        help="""Folder for the kernelspec that loads gpulab's magics in every kernel;
        put first on the servers' JUPYTER_PATH.

        c.FractionalLocalSpawner.kernel_dir = "/srv/gpulab/jupyter"
        """,
    ).tag(config=True)

    @default("kernel_dir")
    def _kernel_dir(self):
        return os.path.join(
            os.environ.get("GPULAB_DATA_DIR", os.path.abspath(".gpulab")), "jupyter"
        )

    @default("options_form")
    def _options_form_default(self):
        return self._render_options_form

    async def _render_options_form(self, spawner):
        availability = await self._client().request(
            "GET", "/availability", query={"user": self.user.name}
        )
        limits = None
        inventory = await self._client().request("GET", "/inventory")
        if self._accounts().enabled:
            gpu_count = sum(len(n["gpus"]) for n in inventory["nodes"])
            held = AccountLimits(config=self.config)
            limits = {
                s["milli"]: held.cgroups().describe(held.limits(s["milli"], gpu_count))
                for s in availability["sizes"]
            }
        return render_form(availability, limits=limits, inventory=inventory)

    def options_from_form(self, formdata):
        values = formdata.get("gpu_milli") or ["0"]
        try:
            return {"gpu_milli": parse_gpu_milli(values[0])}
        except SliceError as e:
            raise _bad_options(str(e)) from None

    cache_root = Unicode(
        help="""Folder of the dataset cache (GPULAB_CACHE_DIR): with per-user accounts
        each user gets `<cache_root>/<account>`, mode 0700.

        c.FractionalLocalSpawner.cache_root = "/var/cache/gpulab"
        """,
    ).tag(config=True)

    #: Who the server runs as (per-user accounts), once started.
    account: Account | None = None
    #: This server's cgroup under its account; unique per start, kept in the hub's
    #: state so a restarted hub still removes it.
    _unit: str = ""

    def _accounts(self) -> UserAccounts:
        return UserAccounts(config=self.config)

    def _write_kernelspec(self) -> None:
        # A python3 kernelspec that loads gpulab's magics; first on JUPYTER_PATH,
        # it shadows the default one in gpulab's servers only. Every account reads it.
        path = os.path.join(self.kernel_dir, "kernels", "python3")
        os.makedirs(path, exist_ok=True)
        for d in (self.kernel_dir, os.path.dirname(path), path):
            os.chmod(d, 0o755)
        spec = {
            "argv": [
                sys.executable,
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
                "--ext=gpulab.magics",
            ],
            "display_name": "Python 3 (gpulab)",
            "language": "python",
            "metadata": {"debugger": True},
        }
        tmp = os.path.join(path, f"kernel.json.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(spec, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(path, "kernel.json"))

    def _cache_dir(self) -> str | None:
        """The user's own dataset cache folder, made for their account."""
        if not self.cache_root or self.account is None:
            return self.cache_root or None
        os.makedirs(self.cache_root, exist_ok=True)
        os.chmod(self.cache_root, 0o711)
        path = os.path.join(self.cache_root, self.account.name)
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chown(path, self.account.uid, self.account.gid)
        return path

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

    def progress(self):
        return self.gpulab_progress()

    async def start(self):
        self.begin_progress()
        milli = parse_user_options(self.user_options)
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
            inventory = await self._client().request("GET", "/inventory") if allocations else {}
            self.gpulab_placement = placement_of(milli, allocations, inventory)
            self.report_progress(40, self.gpulab_placement.sentence())
            accounts = self._accounts()
            if accounts.enabled:
                problem = unreachable(
                    self.cmd[0] if os.path.isabs(self.cmd[0]) else sys.executable, execute=True
                )
                if problem:
                    raise web.HTTPError(
                        500, f"{self.user.name}'s account cannot start JupyterLab: {problem}"
                    )
                self.account = await asyncio.get_running_loop().run_in_executor(
                    None, accounts.ensure, self.user.name
                )
                await self._hold_to_limits(milli, allocations)
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
        self._unit = ""

    async def _hold_to_limits(self, milli: int, allocations: list[dict]) -> None:
        """Start the server as its account, inside a cgroup with the slice's CPU,
        memory and (real GPUs) device limits."""
        limits = AccountLimits(config=self.config)
        real = [a["gpu_uuid"] for a in allocations if a.get("gpu_uuid") and not a.get("simulated")]
        devices = device_paths_for_uuids(real) if real else None
        inventory = await self._client().request("GET", "/inventory")
        gpu_count = sum(len(n["gpus"]) for n in inventory["nodes"])
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
        accounts = self._accounts()
        # After a hub restart this spawner never started: find the account again.
        account = self.account or (accounts.lookup(self.user.name) if accounts.enabled else None)
        if account is not None and self._unit:
            limits = AccountLimits(config=self.config)
            await asyncio.get_running_loop().run_in_executor(
                None, limits.remove, account.name, self._unit
            )

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await self._remove_group()

    def get_env(self):
        env = strip_enforcement_vars(super().get_env())
        env.update(getattr(self, "_slice", {}))
        env["GPULAB_API_URL"] = self.gpulab_public_api_url or self.gpulab_api_url
        paths = [self.kernel_dir] + [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        env["JUPYTER_PATH"] = os.pathsep.join(paths)
        cache = self._cache_dir()
        if cache:
            env["GPULAB_CACHE_DIR"] = cache
        return env
