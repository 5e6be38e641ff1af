"""``%gpulab pools``, and the pools line of ``%gpulab``: where this site's GPUs are.

A site of several pools (the box and a Slurm or Kubernetes cluster) runs a job
that names no pool on the first with room; these lines say which pools there are,
in that order, and how many slices of each size each has free now.
"""

from __future__ import annotations

from html import escape

from gpulab.client.units import plural

from .alerts import STATUS_TIMEOUT_S  # %gpulab waits as long for each of its lines
from .rich import Row, failed, muted


def _fetch(timeout: float | None = None) -> dict:
    from gpulab.client import Client

    client = Client(timeout=timeout) if timeout else Client()
    return client.pools()


def free_text(pool: dict) -> str:
    """``1/4 GPU x12, 1/2 GPU x6, 1 GPU x3`` (or why none)."""
    free = [f"{s['label']} x{s['count']}" for s in pool["free"] if s["count"]]
    if free:
        return ", ".join(free)
    return pool.get("reason") or ("full" if pool["gpus"] else "no GPUs")


def pools_text(data: dict) -> str:
    """One line per pool: name, backend, GPUs, free slices; then what jobs default to."""
    rows = []
    for pool in data["pools"]:
        gpus = f"{plural(pool['gpus'], 'GPU'):>7}"
        rows.append(f"  {pool['name']:<12} {pool['backend']:<11} {gpus}  free: {free_text(pool)}")
    default = data["default"]
    how = "the first pool with room, in this order" if default == "auto" else f"pool {default}"
    return "\n".join(
        [
            "Pools (a job without --pool runs on " + how + "):",
            *rows,
            f"Servers: pool {data['servers']}; endpoints: pool {data['endpoints']}",
        ]
    )


def status_row(env: dict[str, str]) -> Row | None:
    """The pools row of ``%gpulab`` (text: ``Pools: box (local) 1/4 GPU x4; slurm
    full``; in the table a pool a line), or None outside a server gpulab started."""
    if not env.get("GPULAB_API_URL"):
        return None
    try:
        data = _fetch(STATUS_TIMEOUT_S)
    except Exception as e:  # a line, never a traceback
        why = f"could not ask the service ({e})"
        return Row.of("Pools", why, failed(why))
    parts, lines = [], []
    for p in data["pools"]:
        backend = "" if p["name"] == p["backend"] else f" ({p['backend']})"
        parts.append(f"{p['name']}{backend} {free_text(p)}")
        lines.append(f"<b>{escape(p['name'])}</b>{escape(backend)} {escape(free_text(p))}")
    text = "; ".join(parts)
    if data["default"] == "auto":
        text += "; jobs go to the first with room"
        lines.append(muted("jobs go to the first with room"))
    return Row.of("Pools", text, "<br>".join(lines))


def status_line(env: dict[str, str]) -> str | None:
    """``Pools: box (local) 1/4 GPU x4; slurm full`` for ``%gpulab``, or
    None outside a server gpulab started."""
    row = status_row(env)
    return None if row is None else row.text


def pools(line: str) -> None:
    """The ``%gpulab pools`` subcommand."""
    if line.strip():
        print(f"%gpulab pools takes no arguments, got {line.strip()!r}")
        return
    try:
        data = _fetch()
    except Exception as e:
        print(f"could not ask the service for its pools: {e}")
        return
    print(pools_text(data))
