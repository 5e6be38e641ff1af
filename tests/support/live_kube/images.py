"""Container images for the live cluster, made without a registry or a builder.

One small layer, taken from this machine: its Python (interpreter, standard
library, the shared libraries they load), ``/bin/sh`` and ``sleep``. That is
enough for the pods the suite runs (the stand-ins, the pause container); a
pod that needs gpulab's venv (torch, gpulab) mounts it read-only from the host
by ``hostPath`` instead of copying gigabytes into a layer.

The layer is written as a docker-archive (``docker save``'s format: ``manifest.json``,
the config with ``rootfs.diff_ids``, ``layer.tar``), which ``ctr images import``
takes. Cached by Python version, so a second run only imports it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

#: The image pods run (Python 3 as ``python``/``python3``, ``sh``), and the pause image.
PYTHON_IMAGE = "gpulab.local/python:local"
PAUSE_IMAGE = "gpulab.local/pause:local"
FORMAT = 2  # bump when what goes into the layer changes
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The pause container: blocks until the sandbox is stopped.
PAUSE_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"]


def _libraries(binaries: list[str]) -> set[str]:
    """The shared libraries ``binaries`` load (ldd), as real paths and their links."""
    found: set[str] = set()
    out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
        if path.startswith("/"):
            found.add(path)
    return found


def _files() -> list[str]:
    python = os.path.realpath(
        sys.executable if sys.base_prefix == sys.prefix else Path(sys.base_prefix, "bin", "python3")
    )
    stdlib = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})[
        "stdlib"
    ]
    files = [python, "/bin/sh", os.path.realpath("/bin/sh"), "/usr/bin/sleep"]
    dynload = [str(p) for p in Path(stdlib, "lib-dynload").glob("*.so")]
    libs = _libraries([python, os.path.realpath("/bin/sh"), "/usr/bin/sleep", *dynload])
    # torch from a hostPath venv needs the C++ runtime.
    for extra in ("libstdc++.so.6", "libgcc_s.so.1"):
        libs |= {str(p) for p in Path("/usr/lib/x86_64-linux-gnu").glob(extra)}
    skip = {
        "dist-packages",
        "site-packages",
        "test",
        "__pycache__",
        "idlelib",
        "tkinter",
        "ensurepip",
    }
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in skip]
        files += [os.path.join(root, n) for n in names]
    return sorted(set(files) | libs | {os.path.realpath(p) for p in libs})


def _layer(python: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dir(name: str, mode=0o755):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_link(name: str, target: str):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)

        def add_text(name: str, text: str):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        # Debian's merged /usr: /bin, /lib, /lib64 are links into /usr.
        for d in (
            "usr",
            "usr/bin",
            "usr/lib",
            "usr/lib64",
            "etc",
            "root",
            "home",
            "work",
            "dev",
            "proc",
            "sys",
            "run",
            "var",
        ):
            add_dir(d)
        add_dir("tmp", 0o1777)
        for top in ("bin", "lib", "lib64", "sbin"):
            add_link(top, f"usr/{top}")
        add_dir("usr/sbin")
        add_text(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n",
        )
        add_text("etc/group", "root:x:0:\nnogroup:x:65534:\n")
        add_text("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n")
        seen = set()
        for path in _files():
            name = path.lstrip("/")
            for top in ("bin/", "lib/", "lib64/", "sbin/"):
                if name.startswith(top):
                    name = "usr/" + name
            if name in seen or not os.path.exists(path):
                continue
            seen.add(name)
            parent = os.path.dirname(name)
            while parent and parent not in seen:
                seen.add(parent)
                parent = os.path.dirname(parent)
            info = tar.gettarinfo(path, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        for alias in ("python3", "python"):
            if f"usr/bin/{alias}" not in seen:
                add_link(f"usr/bin/{alias}", os.path.basename(python) or version)
    return buf.getvalue()


def _config(diff_id: str, cmd: list[str]) -> bytes:
    return json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": [f"PATH={PATH}"], "Cmd": cmd, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()


def image_archive(cache: Path) -> Path:
    """The docker-archive holding :data:`PYTHON_IMAGE` and :data:`PAUSE_IMAGE` (one
    shared layer), made once per Python version under ``cache``."""
    tag = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}-f{FORMAT}"
    out = cache / f"images-python{tag}.tar"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    python = os.path.realpath(sys.executable)
    layer = _layer(python)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    py_config = _config(diff_id, ["python3"])
    pause_config = _config(diff_id, PAUSE_CMD)
    names = {c: hashlib.sha256(c).hexdigest() + ".json" for c in (py_config, pause_config)}
    manifest = [
        {"Config": names[py_config], "RepoTags": [PYTHON_IMAGE], "Layers": ["layer.tar"]},
        {"Config": names[pause_config], "RepoTags": [PAUSE_IMAGE], "Layers": ["layer.tar"]},
    ]
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for name, data in [
            ("layer.tar", layer),
            *((n, c) for c, n in names.items()),
            ("manifest.json", json.dumps(manifest).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(out)
    return out
