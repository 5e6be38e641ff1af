"""What a client may ask of a deployment, checked: the create body and PATCH's sharing.

Everything here is refused with :class:`DeployRefused` (the HTTP status and a
message that says what to do) before anything is stored or placed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.scheduler.slices import SliceError, noun, parse_gpu_milli
from gpulab.service.endpoints.autoscale import MAX_SCALE_DOWN_DELAY_S

# Used with fullmatch: ``$`` also matches before a last newline ("chat\n" would pass).
NAME = re.compile(r"[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?")
PRINCIPAL = re.compile(r"[^/\s\x00]{1,255}")
DEFAULT_MAX_BATCH = 32

DEFAULT_SCALE_DOWN_DELAY_S = 300.0

#: What a client may set, with the defaults.
SETTINGS = {
    "name": None,
    "replicas": None,  # a fixed count: min_replicas = max_replicas = replicas
    "min_replicas": None,
    "max_replicas": None,
    "target_inflight": None,  # default: the batch size
    "scale_down_delay_s": DEFAULT_SCALE_DOWN_DELAY_S,
    "rollback_margin": None,
    "gpu_milli": 0,
    "max_batch_size": None,
    "max_latency_ms": 5.0,
    "max_queue": 256,
    "stop_with_server": None,
    "share_users": [],
    "share_groups": [],
}
#: What PATCH may change.
SHARING = ("share_users", "share_groups", "stop_with_server")
#: What a new version (``canary``) may set; the rest is the deployment's.
CANARY = ("name", "canary", "gpu_milli", "max_batch_size", "max_latency_ms", "max_queue")


class DeployRefused(Exception):
    """Create/change refused; ``status`` is the HTTP code to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _number(body: dict, key: str, lo: float, hi: float, kind=int):
    v = body[key]
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (kind is int and v != int(v))
        or not lo <= v <= hi
    ):
        raise DeployRefused(
            400,
            f"{key!r} must be {'an integer' if kind is int else 'a number'} "
            f"from {lo:g} to {hi:g}, got {v!r}",
        )
    return kind(v)


#: The most names one share list holds (each listing of endpoints and collections
#: reads every list; a larger audience is a group).
MAX_SHARED_NAMES = 1000


def _names(body: dict, key: str) -> list[str]:
    v = body[key]
    what = "user" if key == "share_users" else "group"
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise DeployRefused(400, f"{key!r} must be a list of {what} names")
    if len(v) > MAX_SHARED_NAMES:
        raise DeployRefused(
            400,
            f"{key!r} holds {len(v)} names, over the {MAX_SHARED_NAMES} one share list "
            f"takes; share with a group instead",
        )
    for x in v:
        if not PRINCIPAL.fullmatch(x):
            raise DeployRefused(
                400,
                f"{x!r} is not a {what} name: a name has no spaces or '/'; "
                f"separate names with commas",
            )
    return sorted(set(v))


def check_sharing(body: dict) -> dict:
    """The sharing fields of a create or PATCH body, validated."""
    out = {}
    for key in ("share_users", "share_groups"):
        if key in body:
            out[key] = _names(body, key)
    if "stop_with_server" in body:
        if not isinstance(body["stop_with_server"], bool):
            raise DeployRefused(400, "'stop_with_server' must be true or false")
        out["stop_with_server"] = body["stop_with_server"]
    return out


def check_patch(body: dict) -> dict:
    unknown = set(body) - set(SHARING)
    if unknown:
        raise DeployRefused(
            400,
            f"only share_users, share_groups and stop_with_server can "
            f"change; not {', '.join(sorted(unknown))}",
        )
    return check_sharing(body)


@dataclass(frozen=True)
class EndpointLimits:
    """The site's caps and defaults for endpoints (``c.GpuLabService`` settings)."""

    slice_sizes: tuple[int, ...]
    max_deployment_replicas: int
    max_user_deployments: int
    max_model_mib: int
    #: What one user's models may hold on disk together (unpacked).
    model_storage_quota_mib: int
    cold_start_seconds: float
    #: A new deployment stops with its owner's server unless it says otherwise.
    stop_with_server: bool
    #: Replicas run on this host, so its CPU and memory quota bounds them.
    local: bool
    #: The shortest scale-down delay of a version holding GPU slices (c.Endpoints).
    min_gpu_scale_down_delay_s: float = 60.0


def check_create(
    limits: EndpointLimits,
    user: str,
    settings: dict,
    over_quota: Callable[[str, int, int, str], str | None],
) -> dict:
    """The deployment's fields from a create body (``max_batch_size`` may stay None:
    it follows the model, see :func:`check_batch`)."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise DeployRefused(
            400,
            f"unknown {noun(len(unknown), 'field')}: {', '.join(sorted(unknown))}; "
            f"known: {', '.join(SETTINGS)}",
        )
    body = {**SETTINGS, **settings}
    name = body["name"]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise DeployRefused(
            400,
            f"'name' must be 1-63 lower-case letters, digits, '.', '_' "
            f"or '-' (starting and ending with a letter or digit), "
            f"got {name!r}",
        )
    low, high = check_replicas(limits, body)
    dep = {
        "name": name,
        "replicas": low,
        "max_replicas": high,
        "target_inflight": (
            None
            if body["target_inflight"] is None
            else _number(body, "target_inflight", 0.1, 100_000, float)
        ),
        "scale_down_delay_s": _number(body, "scale_down_delay_s", 0, MAX_SCALE_DOWN_DELAY_S, float),
        "rollback_margin": (
            None
            if body["rollback_margin"] is None
            else _number(body, "rollback_margin", 0, 1, float)
        ),
        **check_unit(limits, body),
        "stop_with_server": limits.stop_with_server,
        **check_sharing({k: body[k] for k in SHARING if body[k] is not None}),
    }
    if limits.local and not dep["gpu_milli"]:
        # The quota is this host's (a Kubernetes replica is a pod of its own); GPU
        # replicas are bounded by the GPUs first (409 when they cannot be placed).
        reason = over_quota(user, high, dep["gpu_milli"], "replicas")
        if reason:
            raise DeployRefused(403, reason)
    return dep


def check_replicas(limits: EndpointLimits, body: dict) -> tuple[int, int]:
    """``(min, max)`` replicas from ``replicas`` (fixed) or ``min_replicas``/``max_replicas``."""
    cap = limits.max_deployment_replicas
    for key in ("replicas", "max_replicas"):
        if isinstance(body[key], int) and body[key] > cap:
            raise DeployRefused(
                400,
                f"{key!r} {body[key]} is more than the {cap} one deployment may "
                f"have; an admin can raise c.Endpoints.max_deployment_replicas",
            )
    ranged = body["min_replicas"] is not None or body["max_replicas"] is not None
    if body["replicas"] is not None:
        if ranged:
            raise DeployRefused(
                400,
                "give either 'replicas' (a fixed count) or 'min_replicas' and "
                "'max_replicas' (autoscaling), not both",
            )
        n = _number(body, "replicas", 1, cap)
        return n, n
    if not ranged:
        return 1, 1
    low = 1 if body["min_replicas"] is None else _number(body, "min_replicas", 0, cap)
    high = max(low, 1) if body["max_replicas"] is None else _number(body, "max_replicas", 1, cap)
    if high < low:
        raise DeployRefused(
            400,
            f"'max_replicas' {high} is below 'min_replicas' {low}; give MIN:MAX with MIN <= MAX",
        )
    return low, high


def check_unit(limits: EndpointLimits, body: dict) -> dict:
    """What one version runs with: its slice and its batching settings."""
    unit = {
        "max_batch_size": (
            None if body["max_batch_size"] is None else _number(body, "max_batch_size", 1, 4096)
        ),
        "max_latency_ms": _number(body, "max_latency_ms", 0, 10_000, float),
        "max_queue": _number(body, "max_queue", 1, 100_000),
    }
    try:
        unit["gpu_milli"] = parse_gpu_milli(body["gpu_milli"], limits.slice_sizes)
    except SliceError as e:
        raise DeployRefused(400, str(e)) from None
    return unit


def check_canary(limits: EndpointLimits, dep: dict, settings: dict) -> tuple[int, dict]:
    """``(weight, unit settings)`` of a new version of ``dep``; what is not given is
    the deployment's."""
    unknown = set(settings) - set(CANARY)
    if unknown:
        raise DeployRefused(
            400,
            f"a canary takes only {', '.join(CANARY[2:])} besides name and canary; "
            f"not {', '.join(sorted(unknown))} (replicas and sharing are the deployment's)",
        )
    weight = _number(settings, "canary", 1, 99)
    base = {k: dep[k] for k in ("gpu_milli", "max_batch_size", "max_latency_ms", "max_queue")}
    unit = check_unit(limits, {**base, **{k: v for k, v in settings.items() if k in base}})
    if "max_batch_size" not in settings:
        unit["max_batch_size"] = None  # follows the new model (check_batch)
    return weight, unit


def check_batch(dep: dict, card: dict) -> None:
    """Fit ``max_batch_size`` to the model's card: default 32, or what the model takes;
    the autoscaling target defaults to it (a replica is busy when a batch is full)."""
    if dep["max_batch_size"] is None:
        dep["max_batch_size"] = min(DEFAULT_MAX_BATCH, card["max_batch_size"])
    if dep.get("target_inflight", 0) is None:
        dep["target_inflight"] = float(dep["max_batch_size"])
    if dep["max_batch_size"] > card["max_batch_size"]:
        raise DeployRefused(
            400,
            f"max_batch_size {dep['max_batch_size']} is above the "
            f"{card['max_batch_size']} rows the model was exported "
            f"for; lower it or export again with a larger one",
        )
