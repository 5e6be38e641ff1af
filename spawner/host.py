"""FractionalHostSpawner: what gpulab's spawners that run JupyterLab on the site's own
hosts share, as a user's Unix account, the box's local process
(:class:`~gpulab.spawner.local.FractionalLocalSpawner`) and the Slurm job
(:class:`~gpulab.spawner.slurm.FractionalSlurmSpawner`).

Both ask the gpulab service for the slice (:class:`.service_traits.GpuLabServiceMixin`),
show the same spawn form, run the server as the user's account on a filesystem the
hub shares (the kernelspec that loads gpulab's magics, the per-account dataset cache)
and give the server the slice's environment. How the server is started, watched and
stopped (a child process, a batch job) is each subclass's own: this class derives
from JupyterHub's plain :class:`~jupyterhub.spawner.Spawner`, so the Slurm spawner
inherits nothing of a local process (pids, signals, ``popen_kwargs``).

Set what both share on this class, e.g. ``c.FractionalHostSpawner.kernel_dir``;
``c.FractionalLocalSpawner.*`` (or ``c.FractionalSlurmSpawner.*``) is for one only.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys

from jupyterhub.spawner import Spawner
from tornado import web
from traitlets import Bool, Dict, Unicode, default

from gpulab.enforcement.accounts import Account, AccountError, UserAccounts, unreachable
from gpulab.enforcement.environments import jupyter_dir as layer_jupyter_dir
from gpulab.enforcement.environments import (
    layer_dir,
    make_layer_as,
    make_layer_here,
    prefix_python,
)
from gpulab.enforcement.slice_env import strip_enforcement_vars
from gpulab.enforcement.user_env import (
    KERNEL_PREFIX,
    bin_dir,
    environment_kernelspec,
    jupyter_dir,
    kernel_folder,
    kernelspec,
    make_env_as,
    user_python,
    write_atomically,
)

from . import user_options
from .environments import ENVIRONMENT_ENV, EnvironmentsMixin, prefix_problem
from .examples import give_examples_as, shipped_examples
from .form import render_form
from .placement import placement_of
from .service_traits import GpuLabServiceMixin


def users_path(inherited: str) -> str:
    """The ``PATH`` of a server run as a user's account: gpulab's interpreter folder
    (its ``torchrun``, ``jupyter``) first, then what the hub's ``PATH`` names that
    other accounts can enter. A folder they cannot (root's ``~/.pyenv/shims``) would
    answer ``!torchrun`` with "Permission denied" instead of trying the next one."""
    ours = os.path.dirname(sys.executable)
    kept = [p for p in inherited.split(os.pathsep) if p and p != ours and not unreachable(p)]
    return os.pathsep.join([ours, *kept])


class FractionalHostSpawner(GpuLabServiceMixin, EnvironmentsMixin, Spawner):
    """A JupyterLab server held to a GPU slice on one of the site's hosts, as its
    user's Unix account (the shared base of the local and the Slurm spawner)."""

    kernel_dir = Unicode(
        help="""Folder for the kernelspec that loads gpulab's magics in every kernel;
        put first on the servers' JUPYTER_PATH.

        c.FractionalHostSpawner.kernel_dir = "/srv/gpulab/jupyter"
        """,
    ).tag(config=True)

    @default("kernel_dir")
    def _kernel_dir(self):
        return os.path.join(
            os.environ.get("GPULAB_DATA_DIR", os.path.abspath(".gpulab")), "jupyter"
        )

    cache_root = Unicode(
        help="""Folder of the dataset cache (GPULAB_CACHE_DIR): with per-user accounts
        each user gets `<cache_root>/<account>`, mode 0700.

        c.FractionalHostSpawner.cache_root = "/var/cache/gpulab"
        """,
    ).tag(config=True)

    examples_dir = Unicode(
        "",
        help="""Folder of example notebooks each new user is given on their first start:
        a copy to edit in `~/examples`, the originals linked read-only as
        `~/examples/originals`. Empty: the notebooks gpulab ships
        (`<prefix>/share/gpulab/examples`). Given once per user, with per-user accounts.

        c.FractionalHostSpawner.examples_dir = "/srv/gpulab/course-notebooks"
        """,
    ).tag(config=True)

    give_examples = Bool(
        True,
        help="""Give each new user the example notebooks (`examples_dir`) on their first start.

        c.FractionalHostSpawner.give_examples = False
        """,
    ).tag(config=True)

    own_environment = Bool(
        True,
        help="""Give each user a Python environment of their own in their home
        (`~/.gpulab/env`, layered on gpulab's): `%pip install` in a notebook installs
        there, persists across restarts, and their kernels, job ranks and model replicas
        see it; nobody else does. Off: everyone runs gpulab's environment as it is.

        c.FractionalHostSpawner.own_environment = False
        """,
    ).tag(config=True)

    kernels = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Python environments an admin adds, offered as kernels in every server
        beside gpulab's: the name users see -> that environment's interpreter (which
        needs ipykernel; gpulab's magics load where gpulab is installed in it).

        c.FractionalHostSpawner.kernels = {"Python 3.12 (genomics)": "/opt/genomics/bin/python"}
        """,
    ).tag(config=True)

    #: Who the server runs as (per-user accounts), once started.
    account: Account | None = None
    #: The environment the server runs in, once started: (name, prefix, the user's
    #: layer over it); None for gpulab's own.
    _environment: tuple[str, str, str] | None = None

    # How a server starts and is watched is each subclass's: the Slurm spawner's own,
    # the local one's JupyterHub's process spawner (after this class in its MRO, hence
    # super()). JupyterHub's Spawner refuses a class that does not define them.
    async def start(self):
        return await super().start()

    async def poll(self):
        return await super().poll()

    # -- the spawn form ----------------------------------------------------------------
    @default("options_form")
    def _options_form_default(self):
        return self._render_options_form

    async def _render_options_form(self, spawner):
        availability = await self._client().request(
            "GET", "/availability", query={"user": self.user.name}
        )
        inventory = await self._client().request("GET", "/inventory")
        limits = self.form_limits(availability, inventory)
        # JupyterHub keeps the last start's options (its database): offer that size again.
        last = (spawner.user_options or {}).get("gpu_milli")
        return render_form(
            availability,
            limits=limits,
            inventory=inventory,
            last=last,
            hibernated=await self.waiting_hibernation(),
            environments=self.environments_html((spawner.user_options or {}).get("environment")),
        )

    def form_limits(self, availability: dict, inventory: dict) -> dict[int, str] | None:
        """What each size's server is held to besides its GPU (slice milli -> words),
        for the form; None: nothing this spawner enforces itself."""
        return None

    def options_from_form(self, formdata):
        return user_options.options_from_form(formdata)

    def progress(self):
        return self.gpulab_progress()

    async def show_placement(self, milli: int, allocations: list[dict]) -> None:
        """Keep where the ledger put the slice (the admin page's "GPU slices") and say
        it on the spawn page."""
        inventory = await self._client().request("GET", "/inventory") if allocations else {}
        self.gpulab_placement = placement_of(milli, allocations, inventory)
        self.report_progress(40, self.gpulab_placement.sentence())

    # -- the user's account and their files ----------------------------------------------
    def _accounts(self) -> UserAccounts:
        return UserAccounts(config=self.config)

    async def _ensure_account(self, accounts: UserAccounts) -> Account:
        """The user's account, made if missing; one that cannot be theirs (another
        user's, a deleted user's of the same name) a 403 in the user's words rather
        than the hub's "Internal Server Error"."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, accounts.ensure, self.user.name
            )
        except AccountError as e:
            raise web.HTTPError(403, str(e)) from None

    def _write_kernelspec(self) -> None:
        # A python3 kernelspec that loads gpulab's magics; first on JUPYTER_PATH,
        # it shadows the default one in gpulab's servers only. Every account reads it.
        # (A user's own environment brings its own, ahead of this one.) Beside it, the
        # admin's environments (`kernels`), each as gpulab-<its name>.
        kernels = os.path.join(self.kernel_dir, "kernels")
        specs = {"python3": kernelspec(sys.executable)}
        for name, python in self.kernels.items():
            problem = unreachable(python, execute=True)
            if problem:  # the others are still offered; the hub's log says why not this one
                self.log.warning("The kernel %r is not offered: %s", name, problem)
                continue
            specs[kernel_folder(name)] = environment_kernelspec(name, python)
        for folder, spec in specs.items():
            path = os.path.join(kernels, folder)
            os.makedirs(path, exist_ok=True)
            for d in (self.kernel_dir, kernels, path):
                os.chmod(d, 0o755)
            write_atomically(os.path.join(path, "kernel.json"), json.dumps(spec, indent=1))
        for folder in os.listdir(kernels):  # an environment the admin took out
            if folder.startswith(KERNEL_PREFIX) and folder not in specs:
                shutil.rmtree(os.path.join(kernels, folder), ignore_errors=True)

    async def _make_user_env(self) -> None:
        """The account's own Python environment (made on its first start, brought up
        to date on every start)."""
        if not self.own_environment or self.account is None:
            return
        self.report_progress(45, "Preparing your Python environment")
        problem = await asyncio.get_running_loop().run_in_executor(None, make_env_as, self.account)
        if problem:  # the server starts on gpulab's environment; the hub's log says why
            self.log.warning("No Python environment of its own for %s: %s", self.user.name, problem)

    async def _prepare_environment(self) -> None:
        """The environment the user picked (a prefix on this host) with the user's
        layer over it, made by their account; a 400 when it cannot be used."""
        self._environment = None
        name, env = self.chosen_environment()
        if not name:
            return
        prefix = env["prefix"]
        problem = prefix_problem(prefix)
        if problem:  # the admin's setting: said to the user, and to the hub's log
            self.log.warning("Environment %r cannot be used: %s", name, problem)
            raise user_options.bad_options(f"environment {name!r} cannot be used here: {problem}")
        self.report_progress(46, f"Preparing the environment {name}")
        python = prefix_python(prefix)
        if self.account is None:  # servers run as the hub's account: its home
            home = os.path.expanduser("~")
            problem = await asyncio.get_running_loop().run_in_executor(
                None, make_layer_here, home, name, python
            )
        else:
            home = self.account.home
            problem = await asyncio.get_running_loop().run_in_executor(
                None, make_layer_as, self.account, name, python
            )
        if problem:
            raise user_options.bad_options(f"environment {name!r} cannot be used: {problem}")
        self._environment = (name, prefix, layer_dir(home, name))

    async def _give_examples(self) -> None:
        """The example notebooks in the account's home, on its first start."""
        if not self.give_examples or self.account is None:
            return
        source = self.examples_dir or shipped_examples()
        problem = await asyncio.get_running_loop().run_in_executor(
            None, give_examples_as, self.account, source
        )
        if problem:  # the server starts anyway; the hub's log says why
            self.log.warning("Example notebooks not given to %s: %s", self.user.name, problem)

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

    # -- the server's environment ----------------------------------------------------------
    def get_env(self):
        env = strip_enforcement_vars(super().get_env())
        if self.account is not None:
            env.update(self.account.env())
        env.update(getattr(self, "_slice", {}))
        env.update(self.service_env())
        paths = [self.kernel_dir] + [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        if self.account is not None:
            env["PATH"] = users_path(env.get("PATH") or os.defpath)
        if self.own_environment and user_python(self.account, sys.executable) != sys.executable:
            # Their own kernel (their environment's python) and their own pip first.
            paths.insert(0, jupyter_dir(self.account.home))
            env["PATH"] = os.pathsep.join(
                [bin_dir(self.account.home), env.get("PATH") or os.defpath]
            )
        if self._environment is not None:
            # The environment's kernel (the user's layer over it) first, its scripts
            # on the PATH (the layer's pip first), instead of the user's own env.
            name, prefix, layer = self._environment
            paths = [layer_jupyter_dir(layer)] + [
                p for p in paths if p != jupyter_dir(getattr(self.account, "home", ""))
            ]
            env["PATH"] = os.pathsep.join(
                [os.path.join(layer, "bin"), os.path.join(prefix, "bin"), env.get("PATH") or ""]
            )
            env["PYTHONUSERBASE"] = layer
            env[ENVIRONMENT_ENV] = name
        env["JUPYTER_PATH"] = os.pathsep.join(paths)
        cache = self._cache_dir()
        if cache:
            env["GPULAB_CACHE_DIR"] = cache
        return env
