"""Each user's own Python environment: gpulab's packages, plus what they install.

gpulab's environment (its virtualenv, with torch, pandas, scikit-learn and
matplotlib) belongs to root, so ``%pip install`` in it fails, and ``pip install
--user`` is refused in a virtualenv. Each account therefore gets a small
virtualenv of its own in its home (``~/.gpulab/env``), layered on gpulab's: a
``.pth`` file adds gpulab's site-packages *after* the user's, so

- ``%pip install x`` (and ``!pip``, and ``pip`` in a terminal) installs into the
  user's environment, which persists in their home across server restarts;
- what they install shadows gpulab's copy for them alone (pip leaves a package
  outside its environment in place: "Not uninstalling ... outside environment");
- their kernels, their jobs' ranks and their replicas all run its ``python``
  (:func:`user_python`), so a package installed in a notebook imports in each;
- another user's home is ``0700``: nobody else sees what they installed.

It is made by the user's own account, in a process of its own (``python -I -m
gpulab.enforcement.user_env HOME SITE``), like the examples: a link planted in
their home cannot make root write elsewhere. A new interpreter version (gpulab
upgraded from Python 3.11 to 3.12) cannot run the old environment's compiled
packages: the old one is moved aside (``~/.gpulab/env-python3.11``), not deleted.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv

from .accounts import run_module_as

#: The environment's folder, relative to the home.
ENV = os.path.join(".gpulab", "env")
#: The file in its site-packages that adds gpulab's.
LAYER = "gpulab-platform.pth"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def env_dir(home: str) -> str:
    return os.path.join(home, ENV)


def env_python(home: str) -> str:
    return os.path.join(env_dir(home), "bin", "python")


def _site_packages(env: str) -> str:
    return os.path.join(env, "lib", VERSION, "site-packages")


def user_python(account, platform_python: str) -> str:
    """The interpreter that runs ``account``'s code: their own environment's once it
    exists (made for this Python version), else gpulab's."""
    if account is None:
        return platform_python
    env = env_dir(account.home)
    if os.path.exists(os.path.join(_site_packages(env), LAYER)):
        return env_python(account.home)
    return platform_python


def kernelspec(python: str) -> dict:
    """The python3 kernel gpulab's servers offer: ``python``'s ipykernel with gpulab's
    magics loaded."""
    return {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        + ["--ext=gpulab.magics"],
        "display_name": "Python 3 (gpulab)",
        "language": "python",
        "metadata": {"debugger": True},
    }


#: The kernels of the admin's environments: gpulab-<their name>.
KERNEL_PREFIX = "gpulab-"


def kernel_folder(name: str) -> str:
    """The kernelspec folder of an admin's environment named ``name`` (Jupyter's kernel
    names: letters, digits, ``-._``)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "env"
    return f"{KERNEL_PREFIX}{slug}"


def has_module(python: str, module: str) -> bool:
    run = subprocess.run(
        [
            python,
            "-I",
            "-c",
            f"import importlib.util as u, sys; sys.exit(not u.find_spec({module!r}))",
        ],
        capture_output=True,
        timeout=60,
    )
    return run.returncode == 0


def environment_kernelspec(name: str, python: str) -> dict:
    """An admin's environment as a kernel: gpulab's magics where gpulab is in it."""
    spec = kernelspec(python)
    spec["display_name"] = name
    if not has_module(python, "gpulab.magics"):
        spec["argv"].remove("--ext=gpulab.magics")
    return spec


def write_atomically(path: str, text: str, mode: int = 0o644) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def make_env(home: str, platform_site: str) -> None:
    """Make (or bring up to date) ``home``'s environment over ``platform_site``; run
    as the home's owner."""
    env = env_dir(home)
    if os.path.isdir(env) and not os.path.isdir(_site_packages(env)):
        os.replace(env, f"{env}-{_old_version(env)}")  # another Python's: kept aside
    if not os.path.isdir(env):
        os.makedirs(os.path.dirname(env), exist_ok=True)
        # No pip of its own: gpulab's, found through the layer, installs here (it
        # installs into the running interpreter's prefix).
        venv.EnvBuilder(symlinks=True, with_pip=False).create(env)
    # Rewritten on every start: gpulab's environment may have moved.
    write_atomically(
        os.path.join(_site_packages(env), LAYER),
        f"import site; site.addsitedir({platform_site!r})\n",
    )
    # `pip` on the PATH (terminals, `!pip`) is this environment's.
    write_atomically(
        os.path.join(env, "bin", "pip"),
        '#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n',
        0o755,
    )
    # And `torchrun` (`!torchrun` in a notebook) runs this environment's Python.
    write_atomically(
        os.path.join(env, "bin", "torchrun"),
        '#!/bin/sh\nexec "$(dirname "$0")/python" -m torch.distributed.run "$@"\n',
        0o755,
    )
    kernel = os.path.join(env, "share", "jupyter", "kernels", "python3")
    os.makedirs(kernel, exist_ok=True)
    write_atomically(
        os.path.join(kernel, "kernel.json"), json.dumps(kernelspec(env_python(home)), indent=1)
    )


def _old_version(env: str) -> str:
    lib = os.path.join(env, "lib")
    found = sorted(os.listdir(lib)) if os.path.isdir(lib) else []
    return found[0] if found else "old"


def jupyter_dir(home: str) -> str:
    """The folder whose ``kernels/python3`` is the user's kernel (first on the server's
    ``JUPYTER_PATH``)."""
    return os.path.join(env_dir(home), "share", "jupyter")


def bin_dir(home: str) -> str:
    """The environment's scripts (its ``pip``, what the user installs), first on the
    server's ``PATH``."""
    return os.path.join(env_dir(home), "bin")


def make_env_as(account) -> str | None:
    """:func:`make_env` as ``account``; None on success, else why not (the server
    then starts on gpulab's environment)."""
    return run_module_as(
        account, "gpulab.enforcement.user_env", account.home, sysconfig.get_paths()["purelib"]
    )


if __name__ == "__main__":
    make_env(sys.argv[1], sys.argv[2])
