"""Where a model in this kernel came from, remembered per object while it lives.

``%%train_distributed --out model`` tags what comes back with its job (id, code
hash, datasets read, as the service reports them); ``%quantize`` tags its output
with the parent's lineage plus the scheme and its report; ``%deploy`` sends the
tag of what it deploys. Nothing is set on the user's objects: the registry holds
weak references, so a model that is gone takes its tag along, and a model made
any other way has no tag (its lineage then says "no job" rather than guessing).
"""

from __future__ import annotations

import math
import weakref

_tags: dict[int, tuple[weakref.ref, dict]] = {}


def remember(obj, lineage: dict) -> bool:
    """Tag ``obj``; False when it cannot be tagged (no weak reference to it)."""
    key = id(obj)
    try:
        ref = weakref.ref(obj, lambda _, key=key: _tags.pop(key, None))
    except TypeError:
        return False
    _tags[key] = (ref, lineage)
    return True


def lineage_of(obj) -> dict | None:
    """The tag of ``obj``, or None."""
    found = _tags.get(id(obj))
    if found is None or found[0]() is not obj:
        return None
    return found[1]


def from_job(job: dict) -> dict:
    """A model that a job brought back: the job's facts."""
    return {
        "job": {
            "id": job["id"],
            "code_hash": job.get("code_hash"),
            "datasets": [
                {"name": d["name"], "version": d["version"]} for d in job.get("datasets") or []
            ],
        },
        "quantization": None,
    }


def _number(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None  # JSON has no NaN


def quantized(parent: dict | None, report) -> dict:
    """A quantized copy: its parent's job (if any) and what ``%quantize`` measured."""
    return {
        "job": (parent or {}).get("job"),
        "quantization": {
            "scheme": report.scheme,
            "engine": report.engine,
            "device": report.device,
            "size_before": report.size_before,
            "size_after": report.size_after,
            "latency_before_ms": _number(report.latency_before_s * 1000),
            "latency_after_ms": _number(report.latency_after_s * 1000),
            "speedup": _number(report.speedup),
            "max_abs_error": _number(report.max_abs_error),
            "relative_error": _number(report.relative_error),
        },
    }


def untracked() -> dict:
    """What a model of unknown origin says about itself."""
    return {"job": None, "quantization": None}
