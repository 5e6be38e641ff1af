"""Which rank's failure is the job's root cause.

torchrun prints a summary when its workers fail: every failed rank with its
exit code and error file, and a "Root Cause (first observed failure)" chosen by
time. A rank killed by a signal (SIGKILL, the OOM killer) writes no error file,
so torchrun times it when it *notices* the death, after the surviving ranks
already failed on the broken connection; it then names a survivor. And it times
error files in whole seconds. We prefer a rank that died by a signal (other
than the SIGTERM torchrun sends the survivors when it stops them), then the
rank whose own record (``errors/rank<R>.json``, a copy of its error file with a
precise time and the traceback) is earliest, then torchrun's choice.
"""

from __future__ import annotations

import contextlib
import re

_BLOCK = re.compile(r"^\[\d+\]:\n((?:  .*\n?)+)", re.M)
_FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")


def parse_summary(text: str) -> list[dict]:
    """Failures of torchrun's last summary in ``text``; ``root`` marks its root cause."""
    start = text.rfind("Failures:")
    if start < 0:
        start = text.rfind("Root Cause (first observed failure):")
    if start < 0:
        return []
    section = text[start:]
    root_at = section.find("Root Cause (first observed failure):")
    failures = []
    for m in _BLOCK.finditer(section):
        info: dict = {"root": root_at >= 0 and m.start() > root_at}
        key = None
        for line in m.group(1).splitlines():
            f = _FIELD.match(line)
            if f:
                key = f.group(1)
                info[key] = f.group(2).strip()
            elif key == "traceback":
                info["traceback"] += "\n" + line[2:]
        if "rank" not in info:
            continue
        info["rank"] = int(info["rank"].split()[0])
        code = re.match(r"(-?\d+)", info.get("exitcode", ""))
        info["exitcode"] = int(code.group(1)) if code else None
        failures.append(info)
    return failures


def root_cause(failures: list[dict], rank_errors: list[dict]) -> dict | None:
    """``{"rank", "type", "message", "traceback", "error_file", "stderr"}`` of the root
    cause (``stderr``: the last lines the rank wrote there, when its own record says).

    ``rank_errors`` are the ranks' own records, earliest first; their times are
    finer than torchrun's (whole seconds, so it breaks ties arbitrarily).
    """
    keys = ("rank", "type", "message", "traceback", "error_file")
    signalled = [f for f in failures if f["exitcode"] is not None and f["exitcode"] < 0]
    # torchrun itself SIGTERMs the surviving ranks when one fails: not a cause.
    external = [f for f in signalled if f["exitcode"] != -15]
    if not external and rank_errors:
        cause = {k: rank_errors[0].get(k) for k in keys}
        if rank_errors[0].get("stderr"):
            cause["stderr"] = rank_errors[0]["stderr"]
        return cause
    chosen = (external or signalled or [f for f in failures if f["root"]] or [None])[0]
    if chosen is None:
        return None
    tb = chosen.get("traceback", "").strip()
    return {
        "rank": chosen["rank"],
        "type": "Signal" if chosen in signalled else "ExitCode",
        "message": tb.splitlines()[-1] if tb else f"exit code {chosen['exitcode']}",
        "traceback": tb,
        "error_file": None,
    }


def job_root_cause(jd, nodes: int, restarts: int) -> dict | None:
    """The root cause of a failed job (``jd`` a :class:`~.jobdir.JobDir`): torchrun's
    summaries in each node's log and the ranks' own records of this restart."""
    failures = []
    for n in range(nodes):
        with contextlib.suppress(OSError):
            failures += parse_summary(
                jd.read_user_end(f"logs/node{n}.log").decode(errors="replace")
            )
    last = [e for e in jd.errors() if e.get("restart", 0) == restarts]
    return root_cause(failures, last)


#: The log of node rank 0's launcher (torchrun's own words when no rank says more).
NODE0_LOG = "logs/node0.log"


def last_lines(jd, name: str, n: int = 3) -> str:
    """The last ``n`` lines of a job's log file, on one line (empty if it has none)."""
    try:
        text = jd.read_user_end(name, 64 << 10).decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines()[-n:] if ln.strip()]
    return " | ".join(lines)


def failure(jd, nodes: int, restarts: int, code: int, ended: str, logs: list[str], **status):
    """The fields of a failed job's status: the rank that raised and what (its root
    cause), else ``ended`` and the last lines of the first of ``logs`` that has any."""
    error = job_root_cause(jd, nodes, restarts)
    if error:
        message = f"rank {error['rank']} failed: {error['type']}: {error['message']}"
        return dict(exit_code=code, restarts=restarts, error=error, message=message, **status)
    tail = next((t for t in (last_lines(jd, name) for name in logs) if t), "")
    message = ended + (f": {tail}" if tail else "")
    return dict(exit_code=code, restarts=restarts, message=message, **status)
