"""Each enforcement backend's pod patch for a slice, against literal expectations."""

from __future__ import annotations

import pytest
from kube_helpers import validate_strict

from gpulab.enforcement.kube import (
    EnforcementError,
    GpuSlice,
    apply_to_pod,
    backend_names,
    pod_slice_patch,
)
from gpulab.enforcement.kube.kueue import class_patch, queue_patch
from gpulab.enforcement.kube.mig_profiles import card_key, snap

H100 = 81559  # MiB, as GPU Feature Discovery reports an H100 80GB
QUARTER = GpuSlice.of(
    250,
    H100,
    "NVIDIA-H100-80GB-HBM3",
    node="gpu-1",
    gpu_uuids=("GPU-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a",),
)
TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
PIN = {"kubernetes.io/hostname": "gpu-1"}


def _env(**extra):
    return {
        "GPULAB_GPU_MILLI": "250",
        "GPULAB_GPU_UUID": QUARTER.gpu_uuids[0],
        "GPULAB_GPU_MEMORY_MIB": "20389",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **extra,
    }


ALLOC = {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.250"}

QUARTER_PATCHES = {
    "hami": {
        "resources": {
            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20389, "nvidia.com/gpucores": 25}
        },
        "annotations": {"nvidia.com/use-gpuuuid": QUARTER.gpu_uuids[0]},
        "labels": {},
        "env": _env(),
        "scheduler_name": "hami-scheduler",
    },
    "mig": {
        "resources": {"limits": {"nvidia.com/mig-2g.20gb": 1}},
        "annotations": {},
        "labels": {},
        "env": _env(GPULAB_GPU_MEMORY_MIB="20480", GPULAB_MIG_PROFILE="2g.20gb"),
        "scheduler_name": None,
    },
    "mps": {
        "resources": {"limits": {"nvidia.com/gpu.shared": 1}},
        "annotations": {},
        "labels": {},
        "env": _env(
            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=20389M"
        ),
        "scheduler_name": None,
    },
    "timeslice": {
        "resources": {"limits": {"nvidia.com/gpu.shared": 1}},
        "annotations": {},
        "labels": {},
        "env": _env(**ALLOC),
        "scheduler_name": None,
    },
    "nvml-cgroup": {
        "resources": {"limits": {"nvidia.com/gpu.shared": 1}},
        "annotations": {
            "gpulab.io/gpu-milli": "250",
            "gpulab.io/gpu-memory-limit-mib": "20389",
            "gpulab.io/gpu-core-percent": "25",
            "gpulab.io/gpu-uuid": QUARTER.gpu_uuids[0],
        },
        "labels": {},
        "env": _env(**ALLOC),
        "scheduler_name": None,
    },
    "kai": {
        "resources": {},
        "annotations": {"gpu-fraction": "0.25"},
        "labels": {"kai.scheduler/queue": "default"},
        "env": _env(**ALLOC),
        "scheduler_name": "kai-scheduler",
    },
    "volcano": {
        "resources": {
            "limits": {
                "volcano.sh/vgpu-number": 1,
                "volcano.sh/vgpu-memory": 20389,
                "volcano.sh/vgpu-cores": 25,
            }
        },
        "annotations": {},
        "labels": {},
        "env": _env(),
        "scheduler_name": "volcano",
    },
    # No resources: the MIG device comes from a ResourceClaim (tests/kube/test_kube_dra.py).
    "dra": {
        "resources": {},
        "annotations": {},
        "labels": {},
        "env": _env(GPULAB_GPU_MEMORY_MIB="20480", GPULAB_MIG_PROFILE="2g.20gb"),
        "scheduler_name": None,
        "claim": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "mig.nvidia.com",
                                "allocationMode": "ExactCount",
                                "count": 1,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.nvidia.com"]'
                                            '.profile == "2g.20gb"'
                                        }
                                    },
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.nvidia.com"]'
                                            f'.parentUUID == "{QUARTER.gpu_uuids[0]}"'
                                        }
                                    },
                                ],
                            },
                        }
                    ]
                }
            },
            "shared_name": "",
        },
    },
}


@pytest.mark.parametrize("backend", sorted(QUARTER_PATCHES))
def test_quarter_gpu_patch(backend):
    expected = {**QUARTER_PATCHES[backend], "node_selector": PIN, "tolerations": TOLERATION}
    assert pod_slice_patch(backend, QUARTER).to_dict() == expected


def test_every_backend_has_a_literal_expectation():
    assert sorted(backend_names()) == sorted(QUARTER_PATCHES)


WHOLE_LIMITS = {
    "hami": {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100},
    "mig": {"nvidia.com/gpu": 2},
    "mps": {"nvidia.com/gpu": 2},
    "timeslice": {"nvidia.com/gpu": 2},
    "nvml-cgroup": {"nvidia.com/gpu": 2},
    "kai": {"nvidia.com/gpu": 2},
    "volcano": {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-cores": 100},
}


@pytest.mark.parametrize("backend", sorted(WHOLE_LIMITS))
def test_two_whole_gpus(backend):
    s = GpuSlice.of(
        2000, H100, "H100-80GB", node="gpu-1", gpu_uuids=("k8s-gpu-1-gpu0", "k8s-gpu-1-gpu1")
    )
    patch = pod_slice_patch(backend, s)
    assert dict(patch.limits) == WHOLE_LIMITS[backend]
    assert patch.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert patch.env["GPULAB_GPU_MILLI"] == "2000"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in patch.env
    assert not any(k.startswith("CUDA_MPS_") for k in patch.env)
    assert "gpu-fraction" not in patch.annotations


def test_mig_whole_cards_as_full_profile():
    s = GpuSlice.of(1000, 143771, "NVIDIA H200", node="gpu-2")
    patch = pod_slice_patch("mig", s, options={"whole_as_mig": True})
    assert dict(patch.limits) == {"nvidia.com/mig-7g.141gb": 1}


@pytest.mark.parametrize("backend", sorted(QUARTER_PATCHES))
def test_no_gpu_hides_every_gpu(backend):
    assert pod_slice_patch(backend, GpuSlice(0)).to_dict() == {
        "resources": {},
        "annotations": {},
        "labels": {},
        "scheduler_name": None,
        "node_selector": {},
        "tolerations": [],
        "env": {
            "GPULAB_GPU_MILLI": "0",
            "GPULAB_GPU_UUID": "",
            "CUDA_VISIBLE_DEVICES": "",
            "NVIDIA_VISIBLE_DEVICES": "void",
        },
    }


def test_simulated_slice_is_stated_not_enforced():
    s = GpuSlice.of(
        250, 81920, "A100-80GB", node="n", gpu_uuids=("GPU-sim00001-0",), simulated=True
    )
    patch = pod_slice_patch("mig", s)
    assert dict(patch.limits) == {} and patch.scheduler_name is None
    assert patch.env["GPULAB_GPU_SIMULATED"] == "1"
    assert patch.env["NVIDIA_VISIBLE_DEVICES"] == "void"


@pytest.mark.parametrize(
    "card,memory,expected",
    [
        ("H100-80GB", 0, ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]),
        ("NVIDIA H100 80GB HBM3", 0, ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]),
        ("H200-141GB", 0, ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]),
        ("NVIDIA H200", 143771, ["1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"]),
        ("NVIDIA A100-SXM4-40GB", 0, ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]),
        ("NVIDIA-A100-SXM4-80GB", 0, ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]),
        ("NVIDIA A30", 24576, ["1g.6gb", "1g.6gb", "2g.12gb", "4g.24gb"]),
    ],
)
def test_mig_snapping(card, memory, expected):
    assert [snap(m, card, memory).name for m in (100, 250, 500, 1000)] == expected


def test_mig_card_names():
    assert card_key("NVIDIA H100 NVL", 95830) == "H100-94GB"
    assert card_key("NVIDIA-H100-80GB-HBM3") == "H100-80GB"
    with pytest.raises(EnforcementError, match="no MIG profiles known for GPU model 'Tesla T4'"):
        card_key("Tesla T4", 15360)


def test_mig_operator_table():
    table = {"A100-80GB": ["1g.10gb", "3g.40gb", "7g.80gb"]}
    s = GpuSlice.of(250, 81920, "A100-80GB", node="n")
    patch = pod_slice_patch("mig", s, options={"profiles": table})
    assert dict(patch.limits) == {"nvidia.com/mig-3g.40gb": 1}
    with pytest.raises(EnforcementError, match="cannot read MIG profile"):
        pod_slice_patch("mig", s, options={"profiles": {"A100-80GB": ["half"]}})


def test_bad_backend_and_options_say_what_exists():
    with pytest.raises(EnforcementError, match="choose one of: hami, mig"):
        pod_slice_patch("nvshare", QUARTER)
    with pytest.raises(EnforcementError, match="its options are: queue, queue_label"):
        pod_slice_patch("kai", QUARTER, options={"queu": "x"})


def test_backend_options():
    patch = pod_slice_patch("kai", QUARTER, options={"queue": "research"})
    assert patch.labels == {"kai.scheduler/queue": "research"}
    patch = pod_slice_patch("volcano", QUARTER, options={"queue": "research"})
    assert patch.annotations == {"scheduling.volcano.sh/queue-name": "research"}
    patch = pod_slice_patch("hami", QUARTER, options={"scheduler_name": ""})
    assert patch.scheduler_name is None


def test_hami_pins_only_real_uuids():
    s = GpuSlice.of(250, H100, "H100-80GB", node="gpu-1", gpu_uuids=("k8s-gpu-1-gpu0",))
    assert "nvidia.com/use-gpuuuid" not in pod_slice_patch("hami", s).annotations


BASE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer-0", "labels": {"app": "t"}},
    "spec": {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "main",
                "image": "python:3.11-slim",
                "command": ["python", "-V"],
                "resources": {"limits": {"memory": "1Gi"}},
                "env": [
                    {"name": "CUDA_VISIBLE_DEVICES", "value": "0,1,2,3"},
                    {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
                    {"name": "HOME", "value": "/home/u"},
                ],
            }
        ],
    },
}


def test_apply_to_pod_drops_gpus_it_did_not_grant():
    pod = {
        "metadata": {
            "annotations": {"gpu-fraction": "1", "gpulab.io/gpu-milli": "1000", "owner": "x"}
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "resources": {
                        "limits": {"nvidia.com/gpu": 4, "cpu": "1"},
                        "requests": {"volcano.sh/vgpu-number": 1},
                    },
                }
            ]
        },
    }
    out = apply_to_pod(pod, pod_slice_patch("mig", GpuSlice(0)))
    assert out["metadata"]["annotations"] == {"owner": "x"}
    assert out["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}}


def test_apply_to_pod_merges_and_strips():
    pod = apply_to_pod(BASE_POD, pod_slice_patch("hami", QUARTER))
    assert pod["metadata"] == {
        "name": "trainer-0",
        "labels": {"app": "t"},
        "annotations": {"nvidia.com/use-gpuuuid": QUARTER.gpu_uuids[0]},
    }
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["spec"]["nodeSelector"] == PIN
    assert pod["spec"]["tolerations"] == TOLERATION  # not duplicated
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {
        "limits": {
            "memory": "1Gi",
            "nvidia.com/gpu": 1,
            "nvidia.com/gpumem": 20389,
            "nvidia.com/gpucores": 25,
        }
    }
    assert container["env"] == [{"name": "HOME", "value": "/home/u"}] + [
        {"name": k, "value": v} for k, v in _env().items()
    ]
    assert BASE_POD["spec"]["containers"][0]["env"][0]["value"] == "0,1,2,3"  # input untouched


@pytest.mark.parametrize("backend", sorted(QUARTER_PATCHES))
@pytest.mark.parametrize("milli", [0, 250, 1000, 2000])
def test_patched_pods_validate(backend, milli):
    s = GpuSlice.of(
        milli,
        H100,
        "H100-80GB",
        node="gpu-1",
        gpu_uuids=tuple(
            f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(max(1, milli // 1000))
        )
        if milli
        else (),
    )
    assert validate_strict(apply_to_pod(BASE_POD, pod_slice_patch(backend, s)))


def test_kueue_labels():
    assert queue_patch("job", "gpulab", "gpulab-low") == {
        "labels": {
            "kueue.x-k8s.io/queue-name": "gpulab",
            "kueue.x-k8s.io/priority-class": "gpulab-low",
        },
        "priority_class_name": None,
    }
    assert queue_patch("deployment", None, "gpulab-low") == {
        "labels": {},
        "priority_class_name": None,
    }
    # A notebook never waits in a queue; its PriorityClass keeps it from preemption.
    assert queue_patch("server", "gpulab", "gpulab-low") == {
        "labels": {},
        "priority_class_name": "gpulab-notebook",
    }
    with pytest.raises(ValueError, match="owner_kind must be one of"):
        queue_patch("cronjob")


def test_class_patch_names_each_class():
    assert class_patch("job", "batch-high", queue="gpulab", preemptible=False) == {
        "labels": {
            "kueue.x-k8s.io/queue-name": "gpulab",
            "kueue.x-k8s.io/priority-class": "gpulab-batch-high",
        },
        "pod_labels": {},  # Kueue has no per-workload switch; KAI has
        "priority_class_name": "gpulab-batch-high",
    }
    # The kind's class by default; fixed names win; no queue: no Kueue labels.
    assert class_patch("deployment")["priority_class_name"] == "gpulab-serving"
    assert class_patch("job")["priority_class_name"] == "gpulab-batch"
    fixed = class_patch("job", "batch", queue="q", priority="low", priority_class="mine")
    assert fixed["labels"]["kueue.x-k8s.io/priority-class"] == "low"
    assert fixed["priority_class_name"] == "mine"
    assert class_patch("job", "batch", prefix="") == {
        "labels": {},
        "pod_labels": {},
        "priority_class_name": None,
    }
    assert class_patch("job", preemptible=True, kai=True)["pod_labels"] == {
        "kai.scheduler/preemptibility": "preemptible"
    }
    # Servers keep the notebook class and never queue.
    assert class_patch("server", "batch", queue="q") == {
        "labels": {},
        "pod_labels": {},
        "priority_class_name": "gpulab-notebook",
    }
    with pytest.raises(ValueError, match="owner_kind must be one of"):
        class_patch("cronjob")
