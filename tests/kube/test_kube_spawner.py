"""FractionalKubeSpawner: the form, user options, golden pods per backend, no leaks.

The gpulab service is a small real HTTP server here answering with the
service's documented shapes; the Kubernetes API is the one thing faked:
KubeSpawner's own ``_start``/``stop`` (which would create and delete the pod)
are replaced by a recorder of the pod it would create.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from kube_helpers import validate_strict
from kubespawner import KubeSpawner
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets.config import Config

from gpulab.spawner.kube import (
    FractionalKubeSpawner,
    normalize_user_options,
    profiles_from_availability,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPULAB_UPDATE_GOLDEN") == "1"
BACKENDS = ["hami", "mig", "mps", "timeslice", "nvml-cgroup", "kai", "volcano"]
GPU_UUID = "GPU-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a"

AVAILABILITY = {
    "user": "alice",
    "held_milli": 0,
    "quota_milli": None,
    "simulated": False,
    "sizes": [
        {"milli": 0, "label": "no GPU", "count": 1, "available": True, "reason": None},
        {"milli": 250, "label": "1/4 GPU", "count": 6, "available": True, "reason": None},
        {
            "milli": 2000,
            "label": "2 GPUs",
            "count": 0,
            "available": False,
            "reason": "no node has 2 free GPUs",
        },
    ],
}
INVENTORY = {
    "nodes": [
        {
            "name": "gpu-1",
            "gpus": [
                {
                    "uuid": GPU_UUID,
                    "index": 0,
                    "model": "NVIDIA-H100-80GB-HBM3",
                    "memory_mib": 81559,
                    "allocated_milli": 250,
                    "simulated": False,
                    "mig_parent": None,
                }
            ],
        }
    ]
}


class FakeService:
    """What the stand-in service saw, and what it answers next."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict | None]] = []
        self.refuse: tuple[int, str] | None = None


class Handler(web.RequestHandler):
    def initialize(self, svc):
        self.svc = svc

    def _record(self, body=None):
        assert self.request.headers["Authorization"] == "token service-token"
        self.svc.calls.append((self.request.method, self.request.uri, body))

    def get(self, path):
        self._record()
        self.write(AVAILABILITY if path == "availability" else INVENTORY)

    def post(self, path):
        body = json.loads(self.request.body)
        self._record(body)
        if self.svc.refuse:
            self.set_status(self.svc.refuse[0])
            self.finish({"error": self.svc.refuse[1]})
            return
        milli = body["gpu_milli"]
        rows = (
            []
            if milli == 0
            else [
                {
                    "id": "a1",
                    "user": body["user"],
                    "owner_kind": "server",
                    "owner": body["owner"],
                    "node": "gpu-1",
                    "gpu_uuid": GPU_UUID,
                    "milli": milli,
                    "memory_mib": 81559 * milli // 1000,
                    "created": "2026-11-29T12:00:00+00:00",
                    "simulated": False,
                }
            ]
        )
        self.set_status(201)
        self.finish(json.dumps(rows))

    def delete(self, path):
        self._record()
        self.write({"released": []})


@pytest.fixture
async def service():
    svc = FakeService()
    app = web.Application([(r"/services/gpulab/api/v1/(\w+)", Handler, {"svc": svc})])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    svc.url = f"http://127.0.0.1:{port}/services/gpulab/api/v1"
    yield svc
    server.stop()


class Kube:
    """Stands in for the Kubernetes API: records the pod KubeSpawner would create."""

    def __init__(self):
        self.pods: list[dict] = []
        self.fail_next = False


@pytest.fixture
def kube(monkeypatch, offline_kubeconfig):
    k = Kube()

    async def _start(self):
        await self.load_user_options()
        pod = await self.get_pod_manifest()
        k.pods.append(clean(pod.to_dict(serialize=True)))
        if k.fail_next:
            k.fail_next = False
            raise TimeoutError("pod did not start (stand-in)")
        return "http://10.0.0.7:8888"

    async def stop(self, now=False):
        return None

    monkeypatch.setattr(KubeSpawner, "_start", _start)
    monkeypatch.setattr(KubeSpawner, "stop", stop)
    return k


class User:
    name = "alice"
    id = 7
    url = "/user/alice/"


def make_spawner(service, backend="hami", **options) -> FractionalKubeSpawner:
    c = Config()
    c.KubeSpawner.namespace = "gpulab"
    c.KubeSpawner.image = "quay.io/jupyter/scipy-notebook:2025-12-01"
    c.KubeSpawner.environment = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "TZ": "UTC"}
    c.FractionalKubeSpawner.gpulab_api_url = service.url
    c.FractionalKubeSpawner.gpulab_public_api_url = (
        "http://gpulab.gpulab.svc:10101/services/gpulab/api/v1"
    )
    c.FractionalKubeSpawner.gpulab_api_token = "service-token"
    c.FractionalKubeSpawner.enforcement = backend
    c.FractionalKubeSpawner.enforcement_options = options
    c.FractionalKubeSpawner.notebook_priority_class = "gpulab-notebook"
    spawner = FractionalKubeSpawner(config=c, user=User(), _mock=True)
    spawner.api_token = "user-server-token"
    spawner.oauth_client_id = "jupyterhub-user-alice"
    return spawner


def clean(obj):
    """The API's JSON for a model: no nulls; versions that change with upgrades masked."""
    if isinstance(obj, dict):
        out = {k: clean(v) for k, v in obj.items() if v is not None}
        for key in ("hub.jupyter.org/kubespawner-version", "hub.jupyter.org/jupyterhub-version"):
            if key in out:
                out[key] = "<version>"
        return out
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return obj


def env_of(pod: dict) -> dict:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_quarter_gpu_golden_pod(service, kube, backend):
    spawner = make_spawner(service, backend)
    spawner.user_options = {"gpu_milli": 250}
    assert await spawner.start() == "http://10.0.0.7:8888"
    pod = kube.pods[-1]
    path = GOLDEN / f"pod-quarter-{backend}.json"
    if UPDATE:
        path.write_text(json.dumps(pod, indent=1, sort_keys=True) + "\n")
    assert pod == json.loads(path.read_text()), f"{path.name} differs (GPULAB_UPDATE_GOLDEN=1)"
    assert validate_strict(pod)
    env = env_of(pod)
    assert env["GPULAB_GPU_MILLI"] == "250" and env["GPULAB_GPU_UUID"] == GPU_UUID
    assert env["GPULAB_API_URL"].startswith("http://gpulab.gpulab.svc")
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # the operator's "0,1,2,3" is gone
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    assert pod["spec"]["priorityClassName"] == "gpulab-notebook"
    assert service.calls[0] == (
        "POST",
        "/services/gpulab/api/v1/allocations",
        {"user": "alice", "owner_kind": "server", "owner": "alice/", "gpu_milli": 250},
    )


async def test_failed_start_releases_and_leaves_nothing_behind(service, kube):
    spawner = make_spawner(service, "mig")
    spawner.user_options = {"gpu_milli": 250}
    kube.fail_next = True
    with pytest.raises(TimeoutError):
        await spawner.start()
    assert kube.pods[-1]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/mig-2g.20gb": "1"
    }
    assert service.calls[-1] == (
        "DELETE",
        "/services/gpulab/api/v1/allocations?owner_kind=server&owner=alice%2F",
        None,
    )

    # The next spawn asks for no GPU: nothing of the failed slice survives.
    spawner.user_options = {"gpu_milli": 0}
    await spawner.start()
    pod = kube.pods[-1]
    assert "limits" not in pod["spec"]["containers"][0]["resources"] or not any(
        k.startswith("nvidia.com/") for k in pod["spec"]["containers"][0]["resources"]["limits"]
    )
    assert "nodeSelector" not in pod["spec"]
    assert "tolerations" not in pod["spec"]
    env = env_of(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "GPULAB_MIG_PROFILE" not in env and env["GPULAB_GPU_MILLI"] == "0"
    assert validate_strict(pod)


async def test_refused_allocation_is_passed_on_and_starts_nothing(service, kube):
    spawner = make_spawner(service)
    spawner.user_options = {"gpu_milli": 250}
    service.refuse = (409, "no GPU has 250 milli-GPU free")
    with pytest.raises(web.HTTPError) as e:
        await spawner.start()
    assert e.value.status_code == 409 and "250 milli-GPU free" in e.value.log_message
    assert kube.pods == [] and spawner._slice_patch is None


async def test_stop_releases(service, kube):
    spawner = make_spawner(service)
    spawner.user_options = {"gpu_milli": 250}
    await spawner.start()
    await spawner.stop()
    assert service.calls[-1][0] == "DELETE"


async def test_gpus_come_from_the_slice_alone(service, kube):
    spawner = make_spawner(service)
    # Configuration or a pre_spawn_hook asking for GPUs on its own: dropped,
    # while everything else it set stays.
    spawner.extra_resource_limits = {"nvidia.com/gpu": "8", "example.com/fpga": "1"}
    spawner.extra_resource_guarantees = {"nvidia.com/gpu": "8"}
    spawner.extra_annotations = {"gpu-fraction": "1.0", "team": "vision"}
    spawner.node_selector = {"pool": "big"}
    spawner.user_options = {"gpu_milli": 0}
    await spawner.start()
    pod = kube.pods[-1]
    assert pod["spec"]["containers"][0]["resources"] == {
        "limits": {"example.com/fpga": "1"},
        "requests": {},
    }
    assert "gpu-fraction" not in pod["metadata"]["annotations"]
    assert pod["metadata"]["annotations"]["team"] == "vision"
    assert pod["spec"]["nodeSelector"] == {"pool": "big"}

    spawner.user_options = {"gpu_milli": 250}
    await spawner.start()
    pod = kube.pods[-1]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {
        "example.com/fpga": "1",
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "20389",
        "nvidia.com/gpucores": "25",
    }
    assert pod["spec"]["nodeSelector"] == {"pool": "big", "kubernetes.io/hostname": "gpu-1"}


async def test_bad_backend_options_are_a_clear_error(service, kube):
    spawner = make_spawner(service, "kai", queu="x")
    spawner.user_options = {"gpu_milli": 250}
    with pytest.raises(web.HTTPError, match="its options are: queue"):
        await spawner.start()
    assert service.calls == []


async def test_unknown_backend_is_refused_at_configuration(service, offline_kubeconfig):
    with pytest.raises(Exception, match="choose one of: hami, mig"):
        make_spawner(service, "nvshare")


async def test_form_profiles_from_live_availability(service, kube):
    spawner = make_spawner(service)
    profiles = await spawner.profile_list(spawner)
    assert profiles == [
        {
            "display_name": "no GPU",
            "slug": "gpu-0",
            "description": "always available",
            "default": False,
        },
        {
            # The model and memory each size gives, from the live inventory.
            "display_name": "1/4 GPU · NVIDIA-H100-80GB-HBM3 · 19.9 GiB",
            "slug": "gpu-250",
            "description": "6 can be placed now",
            "default": True,
        },
        {
            "display_name": "2 GPUs · NVIDIA-H100-80GB-HBM3 · 159 GiB",
            "slug": "gpu-2000",
            "description": "unavailable now: no node has 2 free GPUs",
            "default": False,
        },
    ]
    assert service.calls == [
        ("GET", "/services/gpulab/api/v1/availability?user=alice", None),
        ("GET", "/services/gpulab/api/v1/inventory", None),
    ]
    # Also after a REST spawn left {"gpu_milli": ...} in user_options.
    spawner.user_options = {"gpu_milli": 250}
    html = await spawner._render_options_form_dynamically(spawner)
    assert 'value="gpu-250"' in html and "unavailable now: no node has 2 free GPUs" in html


async def test_z2jh_empty_profile_list_still_lists_slices(service, kube):
    c = Config()
    c.KubeSpawner.profile_list = []  # what z2jh's jupyterhub_config.py sets by default
    c.FractionalKubeSpawner.gpulab_api_url = service.url
    c.FractionalKubeSpawner.gpulab_api_token = "service-token"
    spawner = FractionalKubeSpawner(config=c, user=User(), _mock=True)
    assert [p["slug"] for p in await spawner.profile_list(spawner)] == [
        "gpu-0",
        "gpu-250",
        "gpu-2000",
    ]


async def test_options_from_form(service, offline_kubeconfig):
    spawner = make_spawner(service)
    assert spawner.options_from_form({"profile": ["gpu-500"]}) == {"gpu_milli": 500}
    assert spawner.options_from_form({"gpu_milli": ["250"]}) == {"gpu_milli": 250}
    with pytest.raises(web.HTTPError, match="not a whole number of GPUs"):
        spawner.options_from_form({"profile": ["gpu-1500"]})
    with pytest.raises(web.HTTPError, match="unknown profile 'big'"):
        spawner.options_from_form({"profile": ["big"]})


def test_user_options_from_rest_and_form():
    assert normalize_user_options({"gpu_milli": 250}) == {"gpu_milli": 250}
    assert normalize_user_options({"profile": "gpu-1000"}) == {"gpu_milli": "1000"}
    assert profiles_from_availability({"sizes": []}) == []


async def test_spawn_page_events_say_where_the_slice_went(service, kube):
    spawner = make_spawner(service, "hami")
    spawner.events_enabled = False  # no Kubernetes API here: KubeSpawner's own pod events end
    spawner.user_options = {"gpu_milli": 250}
    await spawner.start()
    events = [e["message"] async for e in spawner.progress()]
    assert events == [
        "Placed 1/4 GPU on NVIDIA-H100-80GB-HBM3 #0 of node gpu-1 (19.9 GiB)",
        "Enforced by: the hami backend (pod limits, annotations, node pinning)",
        "Starting JupyterLab…",
    ]
    assert spawner.get_state()["gpulab_placement"]["node"] == "gpu-1"


async def test_a_picked_environment_is_the_pods_image_for_that_start(service, kube):
    spawner = make_spawner(service)
    spawner.config.SiteEnvironments.environments = {
        "cu12": {"image": "ghcr.io/site/cu12:1", "description": "CUDA 12"},
        "box-only": {"prefix": "/opt/envs/box"},  # not one a pod can run
    }
    # The form offers the images beside every size; what it posts becomes user_options.
    profiles = await spawner._slice_profiles()
    assert profiles[0]["profile_options"] == {
        "environment": {
            "display_name": "Environment",
            "choices": {
                "-": {"display_name": "gpulab (default)", "default": True},
                "cu12": {"display_name": "cu12 (CUDA 12)"},
            },
        }
    }
    form = {"profile": ["gpu-250"], "profile-option-gpu-250--environment": ["cu12"]}
    assert spawner.options_from_form(form) == {"gpu_milli": 250, "environment": "cu12"}
    assert spawner.options_from_form({"profile": ["gpu-250"]}) == {"gpu_milli": 250}

    spawner.user_options = {"gpu_milli": 250, "environment": "cu12"}
    await spawner.start()
    pod = kube.pods[-1]
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/site/cu12:1"
    env = env_of(pod)
    # Jobs from this server run the same image (the magics read JUPYTER_IMAGE_SPEC).
    assert env["GPULAB_ENVIRONMENT"] == "cu12"
    assert env["JUPYTER_IMAGE_SPEC"] == "ghcr.io/site/cu12:1"
    await spawner.stop()

    # The next start without a choice gets the configured image back.
    spawner.user_options = {"gpu_milli": 0}
    await spawner.start()
    assert kube.pods[-1]["spec"]["containers"][0]["image"] == (
        "quay.io/jupyter/scipy-notebook:2025-12-01"
    )
    assert "GPULAB_ENVIRONMENT" not in env_of(kube.pods[-1])

    spawner.user_options = {"gpu_milli": 0, "environment": "box-only"}
    with pytest.raises(web.HTTPError, match="unknown environment 'box-only'; this site's: cu12"):
        await spawner.start()
