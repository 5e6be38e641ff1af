"""Whether a GPU in a sample is healthy: XID errors, uncorrectable ECC errors, lost.

The NVML sampler (:mod:`.nvml`) fills these fields of each GPU in a sample::

    "xid_errors_total": 3,        # critical XID events seen since the sampler started
    "xids": [79],                 # their codes, seen since the previous sample
    "ecc_uncorrected_errors_total": 0,   # volatile double-bit (uncorrectable) count
    "lost": false,                # NVML says GpuIsLost (fell off the bus)

(``None`` where a board cannot tell). The service's alert rules and its self-healing
read them through :func:`gpu_faults`, so both agree on what a broken GPU is.
"""

from __future__ import annotations

from collections.abc import Mapping

#: XIDs that mean the GPU itself is at fault (hardware, driver or memory), after
#: NVIDIA's XID catalogue; the rest (13, 31, 43, 45...) are usually a program's
#: own fault (an illegal address, a killed context) and do not take the GPU away.
CORDON_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def describe_xid(xid: int) -> str:
    what = CORDON_XIDS.get(xid)
    return f"XID {xid} ({what})" if what else f"XID {xid}"


def gpu_faults(gpu: Mapping, previous: Mapping | None = None) -> list[str]:
    """Why ``gpu`` (one GPU of a sample) must not take new work; empty when healthy.

    ``previous`` is the same GPU in the node's sample before (when there is one):
    an ECC count that grew since then is a fault; a count that was already there at
    the sampler's start is an old one, and an admin's business (a reset clears it).
    """
    faults = []
    if gpu.get("lost"):
        faults.append("GPU lost: NVML answers GpuIsLost (fallen off the bus)")
    bad = sorted({x for x in gpu.get("xids") or [] if x in CORDON_XIDS})
    faults += [describe_xid(x) for x in bad]
    ecc = gpu.get("ecc_uncorrected_errors_total")
    before = (previous or {}).get("ecc_uncorrected_errors_total")
    if isinstance(ecc, int) and isinstance(before, int) and ecc > before:
        n = ecc - before
        faults.append(f"{n} uncorrectable ECC {'error' if n == 1 else 'errors'}")
    return faults
