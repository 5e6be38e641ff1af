"""JSON schemas of NVIDIA's opaque DRA device configurations (``resource.nvidia.com/v1beta1``).

The ResourceClaim, ResourceClaimTemplate and ResourceSlice around them are core
Kubernetes (``resource.k8s.io/v1``) and kubernetes-validate ships their schemas
(1.34 on). The ``parameters`` inside a claim's opaque config are the driver's own,
decoded by the driver, so no Kubernetes schema covers them. These are written
from NVIDIA's k8s-dra-driver-gpu, ``api/nvidia.com/resource/v1beta1``:
``GpuConfig`` and ``MigDeviceConfig`` (``{apiVersion, kind, sharing}``),
``sharing.go`` (``GpuSharing``: ``strategy``, ``timeSlicingConfig.interval``,
``mpsConfig`` with ``defaultActiveThreadPercentage``,
``defaultPinnedDeviceMemoryLimit``, ``defaultPerDevicePinnedMemoryLimit``) and
``validate.go`` (the strategies TimeSlicing and MPS, the intervals Default, Short,
Medium, Long, a thread percentage of 0 to 100). Unknown fields are refused, as
the driver's strict decoder does.
"""

from __future__ import annotations

import jsonschema

_QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"}
_MPS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "defaultActiveThreadPercentage": {"type": "integer", "minimum": 0, "maximum": 100},
        "defaultPinnedDeviceMemoryLimit": _QUANTITY,
        "defaultPerDevicePinnedMemoryLimit": {
            "type": "object",
            "additionalProperties": _QUANTITY,
        },
    },
}
_GPU_SHARING = {
    "type": "object",
    "required": ["strategy"],
    "additionalProperties": False,
    "properties": {
        "strategy": {"enum": ["TimeSlicing", "MPS"]},
        "timeSlicingConfig": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"interval": {"enum": ["Default", "Short", "Medium", "Long"]}},
        },
        "mpsConfig": _MPS,
    },
    # GetTimeSlicingConfig / GetMpsConfig: each strategy's own settings only.
    "allOf": [
        {
            "if": {"properties": {"strategy": {"const": "MPS"}}},
            "then": {"not": {"required": ["timeSlicingConfig"]}},
        },
        {
            "if": {"properties": {"strategy": {"const": "TimeSlicing"}}},
            "then": {"not": {"required": ["mpsConfig"]}},
        },
    ],
}


def _config(kind: str, sharing: dict) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "resource.nvidia.com/v1beta1"},
            "kind": {"const": kind},
            "sharing": sharing,
        },
    }


GPU_CONFIG = _config("GpuConfig", _GPU_SHARING)
MIG_DEVICE_CONFIG = _config(
    "MigDeviceConfig",
    {
        "type": "object",
        "required": ["strategy"],
        "additionalProperties": False,
        "properties": {"strategy": {"enum": ["TimeSlicing", "MPS"]}, "mpsConfig": _MPS},
    },
)
SCHEMAS = {"GpuConfig": GPU_CONFIG, "MigDeviceConfig": MIG_DEVICE_CONFIG}


def check_nvidia_configs(claim: dict) -> int:
    """Validate every opaque config of NVIDIA's driver in ``claim`` (a ResourceClaim or
    ResourceClaimTemplate); how many there were."""
    spec = claim["spec"]["spec"] if claim["kind"] == "ResourceClaimTemplate" else claim["spec"]
    checked = 0
    for config in spec["devices"].get("config") or []:
        opaque = config["opaque"]
        assert opaque["driver"] == "gpu.nvidia.com", opaque["driver"]
        params = opaque["parameters"]
        jsonschema.validate(params, SCHEMAS[params["kind"]])
        checked += 1
    return checked
