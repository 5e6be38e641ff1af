"""This server's slice in words, from the environment the spawner gave it.

The spawner states the slice in ``GPULAB_GPU_*`` variables
(``gpulab.enforcement.slice_env``); the GPU model and card size come from the
service's inventory. One short line for the status bar, and the facts behind it
for the tooltip.
"""

from __future__ import annotations

from gpulab.client.units import gpu_label


def read_slice(env: dict[str, str]) -> dict:
    """The slice as the spawner stated it; ``managed`` is False outside gpulab."""
    uuids = [u for u in (env.get("GPULAB_GPU_UUID") or "").split(",") if u]
    try:
        milli = int(env.get("GPULAB_GPU_MILLI") or 0)
    except ValueError:
        milli = 0
    try:
        memory_mib = int(env["GPULAB_GPU_MEMORY_MIB"])
    except (KeyError, ValueError):
        memory_mib = None
    return {
        "managed": bool(env.get("GPULAB_API_URL")),
        "milli": milli,
        "gpus": uuids,
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "memory_limit_mib": memory_mib,
        "simulated": env.get("GPULAB_GPU_SIMULATED") == "1",
        "enforcement": env.get("GPULAB_GPU_ENFORCEMENT") or None,
        "mig_profile": env.get("GPULAB_MIG_PROFILE") or None,
        "limits": env.get("GPULAB_LIMITS") or None,
        # "" for the user's default server (the hub's name of it: hibernation asks by it)
        "server_name": env.get("JUPYTERHUB_SERVER_NAME", ""),
    }


def fraction_words(milli: int) -> str:
    """250 -> "1/4", 1000 -> "1", 2000 -> "2", 333 -> "0.333": the number of
    ``gpu_label`` (the words gpulab uses everywhere), the model name goes after it."""
    return gpu_label(milli).rsplit(" ", 1)[0]


def enforcement_short(s: dict) -> str:
    """Which mechanism holds the slice, in two or three words."""
    if s["simulated"]:
        return "simulated"
    text = s["enforcement"] or ""
    if text.startswith("MIG"):
        return "MIG"
    if text.startswith("whole card"):
        return "whole GPU"
    if text.startswith("MPS"):
        return "MPS limit"
    if text.startswith("PyTorch"):
        return "PyTorch memory limit"
    return text.split(":")[0] if text else "not enforced"


def gib(mib: float) -> str:
    value = mib / 1024
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def describe(s: dict, models: dict[str, dict], used_mib: float | None, used_note: str) -> dict:
    """``s`` (from :func:`read_slice`) with the model, memory and one line of words.

    ``models``: uuid -> the inventory's GPU (``model``, ``memory_mib``); may be empty
    when the service could not be asked.
    """
    out = dict(s)
    if not s["managed"]:
        out.update(text="gpulab: not set up here", short=None, model=None)
        out.update(memory_used_mib=None, memory_note="this server was not started by gpulab")
        return out
    if s["milli"] <= 0 or not s["gpus"]:
        out.update(text="no GPU", short="none", model=None, memory_used_mib=None)
        out["memory_note"] = "no GPU in this server's slice"
        return out
    gpu = models.get(s["gpus"][0]) or {}
    model = gpu.get("model")
    limit = s["memory_limit_mib"]
    if limit is None and gpu.get("memory_mib"):
        limit = round(gpu["memory_mib"] * min(s["milli"], 1000) / 1000)
    short = enforcement_short(s)
    n = len(s["gpus"])
    what = fraction_words(s["milli"] if n == 1 else s["milli"] // n)
    if s["mig_profile"]:
        what = s["mig_profile"]  # "1g.10gb" says more than 0.143
    if n > 1:
        what = str(n) if what == "1" else f"{n} × {what}"
    words = [f"{what} {model}" if model else f"{what} GPU"]
    if limit:
        words.append(
            f"{gib(used_mib)}/{gib(limit)} GiB" if used_mib is not None else f"{gib(limit)} GiB"
        )
    words.append(short)
    out.update(
        text=" · ".join(words),
        short=short,
        model=model,
        memory_limit_mib=limit,
        memory_used_mib=used_mib,
        memory_note=used_note,
    )
    return out
