"""A user's layer over an admin's Python environment: their own installs on top,
gpulab's packages underneath.

An admin declares environments (a venv or conda prefix on the box); a user picks one
on the spawn form. The server's default kernel then runs that environment's
``python``, so ``sys.prefix`` is the environment's. The environment belongs to root,
so ``%pip install`` cannot write there: each account gets a *layer* per environment
in its home (``~/.gpulab/envs/<name>``), used as Python's user base
(``PYTHONUSERBASE``, with ``PIP_USER=1`` in the kernel), so that

- ``%pip install x`` installs into the layer, which persists in the user's home and
  nobody else sees (their home is ``0700``), and shadows the environment's copy;
- where the environment runs the same Python version as gpulab, the layer's
  ``usercustomize.py`` adds gpulab's site-packages *after* everything else: the
  kernel finds ``ipykernel`` and gpulab's magics there unless the environment has
  its own.

Python reads a user base only where user site-packages are enabled: a conda env, a
plain prefix, or a venv made with ``--system-site-packages``. An isolated venv
(``include-system-site-packages = false``) needs ``ipykernel`` of its own, and
``%pip`` cannot install into it (:func:`isolated_venv` tells the spawner so).

Made by the user's own account, in a process of its own (``python -I -m
gpulab.enforcement.environments HOME NAME PYTHON PLATFORM_SITE``), like
:mod:`.user_env`: a link planted in the home cannot make root write elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig

from traitlets import Dict, TraitError, Unicode, validate
from traitlets.config import Configurable

from .accounts import run_module_as
from .user_env import kernelspec, write_atomically

#: Keys an environment may have, and which spawner reads which: the box's (and the
#: Slurm job's) ``prefix``, Kubernetes' ``image``, Slurm's ``modules``.
KEYS = ("description", "prefix", "image", "modules")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class SiteEnvironments(Configurable):
    """The site's environments, one setting the hub's spawners and the service's job
    backends both read (``c.SiteEnvironments.environments`` in gpulab's config)."""

    environments = Dict(
        help="""Environments users pick on the spawn form, beside the slice: a name ->
        where it is. On the box a venv or conda prefix (`prefix`; make a venv with
        --system-site-packages so gpulab's ipykernel and magics and the user's own
        %pip installs reach it); on Kubernetes an image (`image`); on Slurm
        environment modules (`modules`, loaded before the server starts) and a
        `prefix`. `description` is said on the form. Each spawner offers those it can
        run; the server's kernels and its jobs' ranks run in the one picked. Nothing
        picked: gpulab's own environment.

        c.SiteEnvironments.environments = {
            "pytorch-2.5": {"prefix": "/opt/envs/pt25", "description": "PyTorch 2.5, CUDA 12.4"},
            "cuda-12": {"image": "ghcr.io/site/cu12:1", "modules": ["cuda/12.4"]},
        }
        """,
    ).tag(config=True)

    @validate("environments")
    def _check(self, proposal):
        for name, env in proposal.value.items():
            where = f"c.SiteEnvironments.environments[{name!r}]"
            if not isinstance(name, str) or not _NAME.match(name):
                raise TraitError(f"{where}: a name is 1-63 letters, digits, '.', '_' or '-'")
            if not isinstance(env, dict) or set(env) - set(KEYS):
                raise TraitError(f"{where} must be a dict of {', '.join(KEYS)}")
            modules = env.get("modules", [])
            if not (isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
                raise TraitError(f"{where}['modules'] must be a list of module names")
        return proposal.value

    default_title = Unicode(
        "gpulab (default)",
        help="""How the spawn form names gpulab's own environment (nothing picked).

        c.SiteEnvironments.default_title = "Standard (PyTorch, pandas)"
        """,
    ).tag(config=True)

    def offered(self, *keys: str) -> dict[str, dict]:
        """The environments that have one of ``keys`` (what a spawner can run)."""
        return {n: e for n, e in self.environments.items() if any(e.get(k) for k in keys)}


#: The layers' folder, relative to the home.
LAYERS = os.path.join(".gpulab", "envs")
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def slug(name: str) -> str:
    """A folder name for an environment's name (letters, digits, ``-._``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "env"


def layer_dir(home: str, name: str) -> str:
    return os.path.join(home, LAYERS, slug(name))


def prefix_python(prefix: str) -> str:
    """The interpreter of an environment's prefix."""
    return os.path.join(prefix, "bin", "python")


def isolated_venv(prefix: str) -> bool:
    """A venv that hides user site-packages (no layer, no ``%pip``, its own ipykernel)."""
    try:
        with open(os.path.join(prefix, "pyvenv.cfg")) as f:
            cfg = dict(
                (k.strip().lower(), v.strip().lower())
                for k, _, v in (line.partition("=") for line in f)
            )
    except OSError:
        return False  # a conda env or a plain prefix
    return cfg.get("include-system-site-packages", "false") != "true"


def _python_facts(python: str) -> tuple[str, bool, str]:
    """(``pythonX.Y``, whether it has ipykernel of its own, its ``sys.prefix``)."""
    code = (
        "import sys, importlib.util as u; "
        "print(f'python{sys.version_info[0]}.{sys.version_info[1]}', "
        "bool(u.find_spec('ipykernel')), sys.prefix)"
    )
    out = subprocess.run(
        [python, "-s", "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split(maxsplit=2)
    return out[0], out[1] == "True", out[2].strip()


def layer_site(layer: str, version: str) -> str:
    """Where Python looks in a user base for packages (``site.getusersitepackages``)."""
    return os.path.join(layer, "lib", version, "site-packages")


def make_layer(home: str, name: str, python: str, platform_site: str) -> None:
    """Make (or bring up to date) ``home``'s layer over the environment of ``python``,
    and its kernel; run as the home's owner."""
    layer = layer_dir(home, name)
    version, own_kernel, prefix = _python_facts(python)
    site = layer_site(layer, version)
    os.makedirs(site, exist_ok=True)
    custom = os.path.join(site, "usercustomize.py")
    if version == VERSION:
        # Rewritten on every start: gpulab's environment may have moved. Appended
        # last: the environment's own packages (and the user's) come first.
        write_atomically(custom, f"import site\nsite.addsitedir({platform_site!r})\n")
    elif os.path.exists(custom):
        os.remove(custom)  # another Python's packages would not import here
    # gpulab (its ipykernel, its magics) importable in the kernel, through the layer
    magics = version == VERSION and not isolated_venv(prefix)
    if not (magics or own_kernel):
        raise SystemExit(
            f"{python} has no ipykernel of its own and cannot see gpulab's (it runs "
            f"{version}{', an isolated venv' if isolated_venv(prefix) else ''}): install "
            "ipykernel into the environment, or make the venv with --system-site-packages"
        )
    spec = kernelspec(python)
    if not magics:
        spec["argv"].remove("--ext=gpulab.magics")
    spec["display_name"] = f"Python ({name})"
    # %pip runs `python -m pip` with the kernel's environment: into the layer.
    spec["env"] = {"PYTHONUSERBASE": layer, "PIP_USER": "1"}
    kernel = os.path.join(layer, "share", "jupyter", "kernels", "python3")
    os.makedirs(kernel, exist_ok=True)
    write_atomically(os.path.join(kernel, "kernel.json"), json.dumps(spec, indent=1))
    # `pip` in a terminal installs into the layer too.
    os.makedirs(os.path.join(layer, "bin"), exist_ok=True)
    write_atomically(
        os.path.join(layer, "bin", "pip"),
        f'#!/bin/sh\nPIP_USER=1 exec {python} -m pip "$@"\n',
        0o755,
    )


def jupyter_dir(layer: str) -> str:
    """The folder whose ``kernels/python3`` is the environment's kernel (first on the
    server's ``JUPYTER_PATH``)."""
    return os.path.join(layer, "share", "jupyter")


def make_layer_as(account, name: str, python: str) -> str | None:
    """:func:`make_layer` as ``account``; None on success, else why not."""
    return run_module_as(
        account,
        "gpulab.enforcement.environments",
        account.home,
        name,
        python,
        _platform_site(),
    )


def make_layer_here(home: str, name: str, python: str) -> str | None:
    """:func:`make_layer` in a process of its own as this process's account (where
    users have no accounts of their own); None on success, else why not."""
    run = subprocess.run(
        [sys.executable, "-I", "-m", __name__, home, name, python, _platform_site()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if run.returncode:
        lines = (run.stderr or run.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {run.returncode}"
    return None


def job_environment(site: SiteEnvironments, name: str, account) -> tuple[str, dict[str, str]]:
    """The interpreter a job's ranks run in the environment ``name`` on this host, and
    the variables that put the owner's layer (their installs, gpulab's packages) over
    it; made by the owner's account (``account`` None: this process's). ValueError
    says why the environment cannot run here."""
    env = site.environments.get(name)
    if env is None:
        known = ", ".join(sorted(site.environments)) or "none are set up"
        raise ValueError(f"unknown environment {name!r}; this site's: {known}")
    if not env.get("prefix"):
        raise ValueError(f"the environment {name!r} has no prefix on this host (only an image)")
    python = prefix_python(env["prefix"])
    if account is None:
        home = os.path.expanduser("~")
        problem = make_layer_here(home, name, python)
    else:
        home = account.home
        problem = make_layer_as(account, name, python)
    if problem:
        raise ValueError(f"the environment {name!r} cannot be used: {problem}")
    return python, {"PYTHONUSERBASE": layer_dir(home, name)}


def _platform_site() -> str:
    return sysconfig.get_paths()["purelib"]


if __name__ == "__main__":
    make_layer(*sys.argv[1:5])
