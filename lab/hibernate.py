"""``POST <server>/gpulab/hibernate``: every kernel of this server saves its variables.

Called by the gpulab service (with a token the hub minted for this one call: the
user's own, scoped to this server) when it hibernates this server; the service stops
the server only after this answers 200. Each kernel saves its own
namespace, as the user, to ``~/.gpulab/hibernate/<id>/<n>.state`` (folders 0700,
files 0600); this server writes the hibernation's ``manifest.json`` beside them,
which is how a kernel later finds the state of its notebook
(:mod:`gpulab.magics.hibernate`). The answer holds numbers and names only (what was
saved, what could not be and why), never the state.

A kernel that fails (its state over the cap, a full disk, an object that breaks the
pickler, a cell still running when the wait ends) fails the whole hibernation: the
files are removed and the answer says why, so the service leaves the server running.
A kernel that is shut down or dies while it saves (a closed tab, a script that ends
it) has nothing left to save: it is noticed at once (its kernel manager is watched,
not only its reply awaited), named under ``gone`` in the answer, and the others'
hibernation goes on.
Older hibernations are removed, oldest first, to keep the user's total under the cap.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import time

from jupyter_server.auth.decorator import authorized
from tornado import web

from gpulab.client.hibernations import state_folder

from .handlers import GpuLabHandler

#: A hibernation's id as the service makes them (``h-`` and hex).
ID = re.compile(r"h-[0-9a-f]{6,32}")
#: What to do about state over the cap (c.Hibernation.hibernate_max_bytes).
TOO_LARGE_FIX = (
    "delete large variables you can make again (del x), or ask an admin to raise "
    "c.Hibernation.hibernate_max_bytes"
)
#: Hibernations kept per user besides the cap on bytes.
KEEP = 10
#: How long a kernel may take to start saving (a cell still running) and to save.
SAVE_TIMEOUT_S = 240.0
#: How often a kernel that has not answered yet is looked at: still there, alive?
LIVENESS_S = 0.5

# Run in each kernel: one expression, so nothing is added to the user's namespace.
MODULE = "__import__('gpulab.magics.hibernate', fromlist=['save_kernel'])"
SAVE_CODE = MODULE + ".save_kernel({path!r}, {cap!r})"
RESULT = MODULE + ".last_save()"


class KernelGone(Exception):
    """The kernel was shut down, or died, before it saved: nothing of it to keep."""


class HibernateRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def write_private(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def kernel_pid(km) -> int | None:
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


async def why_gone(kernel_manager, kernel_id: str, km, pid: int | None) -> str | None:
    """Why this kernel can no longer save (None: it still can)."""
    if kernel_id not in kernel_manager or kernel_manager.get_kernel(kernel_id) is not km:
        return "its kernel was shut down while saving"
    if getattr(km, "shutting_down", False):
        return "its kernel was shut down while saving"
    if not await km.is_alive():
        return "its kernel died while saving"
    if kernel_pid(km) != pid:
        return "its kernel restarted while saving (its variables were lost)"
    return None


async def save_one(kernel_manager, kernel_id: str, path: str, cap: int, timeout: float) -> dict:
    """Ask one kernel to save its namespace to ``path``; what it reports. Raises
    :class:`KernelGone` as soon as the kernel is shut down or dies."""
    try:
        km = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise KernelGone("its kernel was shut down before it saved") from None
    pid = kernel_pid(km)
    client = km.client()
    client.start_channels()
    try:
        msg_id = client.execute(
            SAVE_CODE.format(path=path, cap=cap),
            silent=True,
            store_history=False,
            user_expressions={"r": RESULT},
            allow_stdin=False,
        )
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HibernateRefused(
                    409,
                    f"a kernel did not save within {timeout:.0f} s (a cell still running?); "
                    "interrupt it or wait, then hibernate again",
                )
            try:
                reply = await client.get_shell_msg(timeout=min(left, LIVENESS_S))
            except Exception:  # queue.Empty: keep waiting, while the kernel lives
                gone = await why_gone(kernel_manager, kernel_id, km, pid)
                if gone:
                    raise KernelGone(gone) from None
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content.get("status") != "ok":
            ename, evalue = content.get("ename", "Error"), content.get("evalue", "")
            if ename == "StateTooLarge":
                what = evalue.removeprefix("the ")  # "state is over the cap of 50 MB"
                raise HibernateRefused(413, f"a kernel's {what}: {TOO_LARGE_FIX}")
            status = 507 if ename == "OSError" or "No space left" in evalue else 500
            raise HibernateRefused(status, f"a kernel could not save: {ename}: {evalue}")
        value = content.get("user_expressions", {}).get("r", {})
        if value.get("status") != "ok":
            raise HibernateRefused(500, f"the kernel saved no report ({value.get('evalue')})")
        return json.loads(ast.literal_eval(value["data"]["text/plain"]))
    finally:
        client.stop_channels()


async def kernel_names(session_manager, kernel_manager) -> dict[str, dict]:
    """kernel id -> its name in the hibernation and the notebook it belongs to (as the
    kernel sees it: ``$JPY_SESSION_NAME``), for kernels of a notebook or a console."""
    out = {}
    for s in await session_manager.list_sessions():
        kid = (s.get("kernel") or {}).get("id")
        if not kid:
            continue
        path, name = s.get("path") or "", s.get("name") or None
        try:
            env = session_manager.get_kernel_env(path, name)
            notebook = env.get("JPY_SESSION_NAME", path)
        except Exception:
            notebook = path
        out[kid] = {"name": path or kid[:8], "notebook": notebook}
    for kid in kernel_manager.list_kernel_ids():
        out.setdefault(kid, {"name": f"kernel-{kid[:8]}", "notebook": ""})
    return out


def remove_partial(path: str) -> None:
    """What a kernel that went away while saving left of ``path``: its temporary file
    (``.<name>.<random>.tmp``, see ``save_namespace``), or the file itself."""
    folder, name = os.path.split(path)
    for f in os.listdir(folder):
        if f == name or (f.startswith(f".{name}.") and f.endswith(".tmp")):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, f))


def prune(root: str, keep: str, cap: int) -> list[str]:
    """Remove older hibernations until the rest fit under ``cap`` bytes (and at most
    :data:`KEEP`); ``keep`` (the new one) stays. The ids removed."""
    entries = []
    for hid in os.listdir(root):
        folder = os.path.join(root, hid)
        if not ID.fullmatch(hid) or not os.path.isdir(folder):
            continue
        size = sum(
            os.path.getsize(os.path.join(folder, f))
            for f in os.listdir(folder)
            if os.path.isfile(os.path.join(folder, f))
        )
        entries.append((os.path.getmtime(folder), hid, size))
    entries.sort(reverse=True)  # newest first
    removed, total = [], 0
    for n, (_, hid, size) in enumerate(entries):
        total += size
        if hid != keep and (total > cap or n >= KEEP):
            shutil.rmtree(os.path.join(root, hid), ignore_errors=True)
            removed.append(hid)
            total -= size
    return removed


async def hibernate_kernels(serverapp_settings, hid: str, cap: int) -> dict:
    kernel_manager = serverapp_settings["kernel_manager"]
    session_manager = serverapp_settings["session_manager"]
    root = state_folder()
    private_dir(os.path.dirname(root))
    private_dir(root)
    folder = os.path.join(root, hid)
    if os.path.exists(folder):
        raise HibernateRefused(409, f"hibernation {hid} was already saved here")
    private_dir(folder)
    started = time.monotonic()
    try:
        names = await kernel_names(session_manager, kernel_manager)
        ids = list(names)
        files = [os.path.join(folder, f"{n}.state") for n in range(len(ids))]
        saves = [
            save_one(kernel_manager, kid, f, cap, SAVE_TIMEOUT_S)
            for kid, f in zip(ids, files, strict=True)
        ]
        # Every kernel ends (saved or not) before a failure removes the folder.
        reports = await asyncio.gather(*saves, return_exceptions=True)
        for failure in reports:
            if isinstance(failure, BaseException) and not isinstance(failure, KernelGone):
                raise failure
        kernels, gone = [], []
        for kid, f, report in zip(ids, files, reports, strict=True):
            if isinstance(report, KernelGone):
                remove_partial(f)
                gone.append({**names[kid], "why": str(report)})
                continue
            kernels.append(
                {
                    **names[kid],
                    "file": os.path.basename(f),
                    "variables": report["variables"],
                    "saved": len(report["saved"]),
                    "skipped": report["skipped"],
                    "bytes": report["bytes"],
                    "seconds": report["seconds"],
                }
            )
        total = sum(k["bytes"] for k in kernels)
        if total > cap:
            raise HibernateRefused(
                413,
                f"the kernels' state together ({total:,} bytes) is over the {cap:,} bytes "
                f"kept per user: {TOO_LARGE_FIX}",
            )
        manifest = {
            "id": hid,
            "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "kernels": kernels,
            "gone": gone,
            "bytes": total,
        }
        write_private(os.path.join(folder, "manifest.json"), json.dumps(manifest, indent=1))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    removed = prune(root, hid, cap)
    return {**manifest, "seconds": round(time.monotonic() - started, 3), "removed": removed}


class HibernateHandler(GpuLabHandler):
    @web.authenticated
    @authorized
    async def post(self):
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):  # nested past Python's limit
            return self.fail(400, 'the body must be JSON: {"id": "h-...", "max_bytes": N}')
        hid, cap = body.get("id"), body.get("max_bytes")
        if not isinstance(hid, str) or not ID.fullmatch(hid):
            return self.fail(400, "'id' must be a hibernation id (h-<hex>)")
        if not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0:
            return self.fail(400, "'max_bytes' must be a positive integer")
        try:
            result = await hibernate_kernels(self.settings, hid, cap)
        except HibernateRefused as e:
            return self.fail(e.status, e.message)
        except OSError as e:
            return self.fail(507, f"could not write the state: {e}")
        self.log.info(
            "gpulab: hibernation %s saved %d kernel(s), %d bytes%s",
            hid,
            len(result["kernels"]),
            result["bytes"],
            "".join(f"; {k['name']}: {k['why']}" for k in result["gone"]),
        )
        self.finish(json.dumps(result))
