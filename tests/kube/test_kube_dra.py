"""The ``dra`` enforcement backend: a slice as a ResourceClaim against NVIDIA's DRA driver.

The claims, templates and pods are the real builders' output, checked against
literal expectations and the ``resource.k8s.io/v1`` schemas kubernetes-validate
ships (Kubernetes 1.34, where DRA went GA, and the newest it knows); NVIDIA's
opaque ``GpuConfig`` against ``dra_schemas``. The Kubernetes API server is the one
thing faked (``fake_apiserver``: real HTTP, the real ``kubernetes_asyncio`` client,
ResourceSlices served as NVIDIA's driver publishes them); no GPU runs here.
"""

from __future__ import annotations

import asyncio
import json

import kubernetes_validate
import pytest
from aiohttp import web
from dra_schemas import check_nvidia_configs
from fake_apiserver import FakeApiServer
from kube_helpers import K8S_VERSIONS, validate_strict
from test_chart import HUB_OFF, chart, render, service_values_of  # noqa: F401 (a fixture)
from test_kube_spawner import kube, make_spawner, service  # noqa: F401 (fixtures)

from gpulab.backend.kubernetes.dra_inventory import (
    fetch_resource_slices,
    mig_devices,
    parse_resource_slices,
)
from gpulab.backend.kubernetes.inventory import KubernetesInventory
from gpulab.backend.spec import JobSpec
from gpulab.enforcement.kube import (
    EnforcementError,
    GpuSlice,
    apply_to_pod,
    check_backend,
    dra,
    pod_slice_patch,
)
from gpulab.scheduler.inventory import Gpu

#: DRA is GA (resource.k8s.io/v1) from 1.34; the newest versions kubernetes-validate knows.
DRA_VERSIONS = ["1.34", *K8S_VERSIONS]
H100 = "NVIDIA H100 80GB HBM3"
UUID_A = "GPU-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a"
UUID_B = "GPU-2d1c0b9a-8e7f-4a6b-9c5d-0e1f2a3b4c5d"
RESOURCE = "/apis/resource.k8s.io/v1"
TEMPLATES = f"{RESOURCE}/namespaces/gpulab/resourceclaimtemplates"
CLAIMS = f"{RESOURCE}/namespaces/gpulab/resourceclaims"


def validate_dra(obj: dict) -> None:
    """``obj`` against the resource.k8s.io/v1 schemas of every version in DRA_VERSIONS."""
    for version in DRA_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            caught = getattr(e, "caught", e)  # strict mode raises jsonschema's own error
            raise AssertionError(
                f"{obj['kind']}/{obj['metadata']['name']} is invalid for {version}: "
                f"{caught.message} at {'.'.join(map(str, caught.absolute_path))}"
            ) from None


def attr(name: str) -> str:
    return f'device.attributes["gpu.nvidia.com"].{name}'


def quarter(**kw) -> GpuSlice:
    return GpuSlice.of(250, 81559, H100, node="gpu-1", gpu_uuids=(UUID_A,), **kw)


# -- the claims, one per sharing mode ------------------------------------------------

EITHER_CARD = f"{attr('uuid')} in {json.dumps([UUID_A, UUID_B])}"
EXPECTED_SPECS = {
    "whole": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 2,
                        "selectors": [{"cel": {"expression": EITHER_CARD}}],
                    },
                }
            ]
        }
    },
    "mig": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "mig.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "selectors": [
                            {"cel": {"expression": f'{attr("profile")} == "2g.20gb"'}},
                            {"cel": {"expression": f'{attr("parentUUID")} == "{UUID_A}"'}},
                        ],
                    },
                }
            ]
        }
    },
    **{
        mode: {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": f'{attr("uuid")} == "{UUID_A}"'}}],
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": "gpu.nvidia.com",
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "GpuConfig",
                                "sharing": sharing,
                            },
                        },
                    }
                ],
            }
        }
        for mode, sharing in [
            ("mps", {"strategy": "MPS"}),
            ("timeslicing", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        ]
    },
}


def slice_of(mode: str) -> GpuSlice:
    if mode == "whole":
        return GpuSlice.of(2000, 81559, H100, node="gpu-1", gpu_uuids=(UUID_A, UUID_B))
    return quarter()


def options_of(mode: str) -> dict:
    return {
        "whole": {},
        "mig": {"sharing": "mig"},
        "mps": {"sharing": "mps"},
        "timeslicing": {"sharing": "timeslicing", "time_slice_interval": "Long"},
    }[mode]


@pytest.mark.parametrize("mode", ["whole", "mig", "mps", "timeslicing"])
def test_a_claim_per_sharing_mode(mode):
    claim = dra.resource_claim("jupyter-alice-gpu", slice_of(mode), options_of(mode))
    shared = mode in ("mps", "timeslicing")
    # A fraction shared through MPS or time-slicing is its card's claim, for every pod on it.
    name = "gpulab-gpu-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a" if shared else "jupyter-alice-gpu"
    assert claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": EXPECTED_SPECS[mode],
    }
    validate_dra(claim)
    assert check_nvidia_configs(claim) == (1 if shared else 0)


@pytest.mark.parametrize("mode", ["whole", "mig"])
def test_a_template_per_job_pins_the_model_not_one_card(mode):
    """Every pod of a job or deployment version gets its own claim from one template, so
    the template cannot name one card: it names the model the ledger chose."""
    s = GpuSlice.of(1000 if mode == "whole" else 250, 81559, H100)
    template = dra.resource_claim_template("gpulab-f00dfeedbeef-gpu", s, options_of(mode))
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    model = {"cel": {"expression": f'{attr("productName")} == "{H100}"'}}
    if mode == "whole":
        assert exactly["selectors"] == [model] and exactly["count"] == 1
    else:
        assert exactly["selectors"] == [{"cel": {"expression": f'{attr("profile")} == "2g.20gb"'}}]
    assert template["kind"] == "ResourceClaimTemplate"
    validate_dra(template)
    with pytest.raises(EnforcementError, match="reference ResourceClaim gpulab-gpu-"):
        dra.resource_claim_template("x", quarter(), {"sharing": "mps"})


def test_the_schemas_refuse_what_v1_dropped():
    """The v1beta1 request shape (deviceClassName beside the name, no ``exactly``) is not
    v1: the schemas the tests check against do refuse a wrong claim."""
    claim = dra.resource_claim("c", quarter(), {"sharing": "mig"})
    request = claim["spec"]["devices"]["requests"][0]
    request.update(request.pop("exactly"))
    with pytest.raises(AssertionError, match="invalid for 1.34"):
        validate_dra(claim)
    bad_config = dra.resource_claim("c", quarter(), {"sharing": "mps"})
    params = bad_config["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    params["sharing"]["timeSlicingConfig"] = {"interval": "Default"}  # not with MPS
    with pytest.raises(Exception, match="should not be valid|is not valid"):
        check_nvidia_configs(bad_config)


# -- pods --------------------------------------------------------------------------

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "jupyter-alice"},
    "spec": {
        "containers": [
            {
                "name": "notebook",
                "image": "quay.io/jupyter/scipy-notebook:2025-12-01",
                "resources": {"limits": {"nvidia.com/gpu": 4, "cpu": "2"}},
            }
        ]
    },
}


@pytest.mark.parametrize("mode", ["whole", "mig", "mps", "timeslicing"])
def test_pods_carry_the_claim_and_no_gpu_resources(mode):
    patch = pod_slice_patch("dra", slice_of(mode), options=options_of(mode))
    source = dra.pod_claim_source(patch, "jupyter-alice-gpu", template=False)
    pod = apply_to_pod(POD, patch, claim=source)
    validate_strict(pod)
    c = pod["spec"]["containers"][0]
    # The devices come from the claim: what asked for nvidia.com/gpu before is gone.
    assert c["resources"] == {"limits": {"cpu": "2"}, "claims": [{"name": "gpu"}]}
    shared = mode in ("mps", "timeslicing")
    claim = "gpulab-gpu-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a" if shared else "jupyter-alice-gpu"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim}]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["GPULAB_GPU_UUID"] == ",".join(slice_of(mode).gpu_uuids)
    if mode == "mps":  # each pod's own MPS client limits: the card's claim is shared
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20389M"
    if mode == "timeslicing":
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.250"
    if mode == "mig":
        assert env["GPULAB_MIG_PROFILE"] == "2g.20gb"
    # Applied twice (a template patched again): one claim, not two.
    again = apply_to_pod(pod, patch, claim=source)
    assert again["spec"]["resourceClaims"] == pod["spec"]["resourceClaims"]
    assert again["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]


def test_bad_options_and_slices_say_what_to_do():
    with pytest.raises(EnforcementError, match="sharing 'gpu-share' is not one of mig, mps"):
        check_backend("dra", {"sharing": "gpu-share"})
    with pytest.raises(EnforcementError, match="time_slice_interval 'Fast'"):
        check_backend("dra", {"time_slice_interval": "Fast"})
    # A card named by the node inventory (no real UUID) cannot be a shared claim.
    named = GpuSlice.of(250, 81559, H100, gpu_uuids=("k8s-gpu-1-gpu0",))
    with pytest.raises(EnforcementError, match='source = "resourceslices"'):
        pod_slice_patch("dra", named, options={"sharing": "mps"})
    with pytest.raises(EnforcementError, match="needs the GPU's model"):
        pod_slice_patch("dra", GpuSlice.of(250, 81559), options={"sharing": "mig"})
    # A pod template (a Job's, a Deployment's) is no pod of its own name: its claim
    # template must be named.
    template = {"metadata": {"labels": {"app": "t"}}, "spec": POD["spec"]}
    own = pod_slice_patch("dra", quarter(), options={"sharing": "mig"})
    with pytest.raises(EnforcementError, match="needs the name of the pod's ResourceClaim"):
        apply_to_pod(template, own)
    # A named Pod's own claim is <pod name>-gpu, the spawner's name for it.
    assert apply_to_pod(POD, own)["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": "jupyter-alice-gpu"}
    ]


# -- the inventory from ResourceSlices -------------------------------------------------


def gpu_device(minor: int, uuid: str, product: str = H100, memory: str = "81559Mi") -> dict:
    """A card as NVIDIA's driver publishes it (cmd/gpu-kubelet-plugin/deviceinfo.go)."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"},
            "pcieBusID": {"string": f"0000:{minor + 0x18:02x}:00.0"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def mig_device(parent: str, profile: str, memory: str) -> dict:
    return {
        "name": f"gpu-1-mig-{profile.replace('.', '')}-0",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"},
            "parentUUID": {"string": parent},
            "profile": {"string": profile},
            "productName": {"string": H100},
        },
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": "16"}},
    }


def resource_slice(node: str, devices: list[dict], generation: int = 1, driver="gpu.nvidia.com"):
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


UUID_C = "GPU-5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
SLICES = [
    resource_slice("gpu-1", [gpu_device(0, UUID_A), gpu_device(1, UUID_B)]),
    # A pool republished: generation 2 replaces 1 (the old card is gone).
    resource_slice("gpu-2", [gpu_device(0, "GPU-00000000-old0-0000-0000-000000000000")]),
    resource_slice(
        "gpu-2",
        [
            gpu_device(1, UUID_C, "NVIDIA H200", "143771Mi"),
            mig_device(UUID_C, "1g.18gb", "16384Mi"),
        ],
        generation=2,
    ),
    # Another driver's devices are no GPUs of ours.
    resource_slice("gpu-1", [{"name": "nic-0", "attributes": {}}], driver="rdma.example.com"),
]


def test_resource_slices_are_valid_v1_objects():
    for s in SLICES:
        validate_dra(s)


def test_cards_come_from_the_drivers_current_slices():
    gpus, reason = parse_resource_slices(SLICES)
    assert reason is None
    assert gpus == [
        Gpu(UUID_A, 0, H100, 81559, "gpu-1"),
        Gpu(UUID_B, 1, H100, 81559, "gpu-1"),
        Gpu(UUID_C, 1, "NVIDIA H200", 143771, "gpu-2"),
    ]
    assert mig_devices(SLICES) == {UUID_C: ["1g.18gb"]}
    assert parse_resource_slices(SLICES, nodes={"gpu-2"})[0] == [gpus[2]]
    assert parse_resource_slices([])[1].startswith("no ResourceSlice of the DRA driver")


class SlicesApiServer(FakeApiServer):
    """The fake API server, also listing a collection (``GET`` of its path) with the
    ``fieldSelector`` and ``labelSelector`` a ResourceSlice and Node list use."""

    def __init__(self, groups=("batch", "apps", "resource.k8s.io")):
        super().__init__(groups)

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        if request.method != "GET" or path in self.objects:
            return await super()._objects(request)
        self.requests.append(("GET", request.path_qs, None))
        items = [o for k, o in self.objects.items() if k.rsplit("/", 1)[0] == path]
        field = request.query.get("fieldSelector", "")
        if field.startswith("spec.driver="):
            items = [o for o in items if o["spec"]["driver"] == field.split("=", 1)[1]]
        label = request.query.get("labelSelector", "")
        if label:
            key, value = label.split("=", 1)
            items = [o for o in items if o["metadata"].get("labels", {}).get(key) == value]
        return web.json_response(
            {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
        )


@pytest.fixture
async def slices_api(tmp_path):
    server = await SlicesApiServer().start()
    for s in SLICES:
        server.objects[f"{RESOURCE}/resourceslices/{s['metadata']['name']}"] = s
    for name, labels in [("gpu-1", {"pool": "big"}), ("gpu-2", {})]:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        server.objects[f"/api/v1/nodes/{name}"] = node
    yield server, server.kubeconfig(tmp_path / "kubeconfig")
    await server.stop()


async def test_the_inventory_reads_resource_slices_from_the_api(slices_api):
    server, kubeconfig = slices_api
    inventory = KubernetesInventory(source="resourceslices", kubeconfig=kubeconfig)
    # load() runs its own event loop (the service calls it at start): in a thread here.
    gpus, reason = await asyncio.to_thread(inventory.load)
    assert reason is None
    assert [(g.uuid, g.model, g.memory_mib, g.node) for g in gpus] == [
        (UUID_A, H100, 81559, "gpu-1"),
        (UUID_B, H100, 81559, "gpu-1"),
        (UUID_C, "NVIDIA H200", 143771, "gpu-2"),
    ]
    # Only the driver's slices are asked for.
    asked = [p for m, p, _ in server.requests if "resourceslices" in p]
    assert asked == [f"{RESOURCE}/resourceslices?fieldSelector=spec.driver%3Dgpu.nvidia.com"]
    # A label selector keeps its nodes' cards only.
    inventory = KubernetesInventory(
        source="resourceslices", kubeconfig=kubeconfig, label_selector="pool=big"
    )
    gpus, _ = await asyncio.to_thread(inventory.load)
    assert {g.node for g in gpus} == {"gpu-1"}
    slices, nodes = await fetch_resource_slices(kubeconfig, "rdma.example.com")
    assert [s["spec"]["driver"] for s in slices] == ["rdma.example.com"] and nodes is None


async def test_the_inventory_says_why_slices_cannot_be_listed(tmp_path):
    server = await FakeApiServer().start()  # lists nothing: 404 for the collection
    try:
        inventory = KubernetesInventory(
            source="resourceslices", kubeconfig=server.kubeconfig(tmp_path / "kubeconfig")
        )
        with pytest.raises(
            Exception,
            match=r"ResourceSlices cannot be listed \(HTTP 404 Not Found\); .* list resourceslices",
        ):
            await asyncio.to_thread(inventory.load)
    finally:
        await server.stop()


# -- where the claims are made: jobs, endpoints, servers ------------------------------

GPUS = [Gpu(UUID_A, 0, H100, 81559, "gpu-1"), Gpu(UUID_B, 1, H100, 81559, "gpu-1")]


def job_spec(**kw) -> JobSpec:
    fields = dict(
        code="print(1)",
        nodes=1,
        gpu_milli=250,
        image="registry.example/gpulab:1",
        id="f00dfeed0001",
        user="ann",
        max_restarts=2,
        backend="kubernetes",
    )
    fields.update(kw)
    s = JobSpec(**fields)
    s.validate()
    return s


async def test_a_job_gets_a_claim_template_made_before_it_and_gone_with_it(job_cluster):
    server, backend = await job_cluster(
        ("batch", "apps"), enforcement="dra", enforcement_options={"sharing": "mig"}, gpus=GPUS
    )
    spec = job_spec()
    rows = [{"gpu_uuid": UUID_A, "milli": 250, "node": "gpu-1"}]
    await backend.start(spec, rows)
    posts = [p for m, p, _ in server.requests if m == "POST"]
    assert posts.index(TEMPLATES) < posts.index("/apis/batch/v1/namespaces/gpulab/jobs")
    template = server.get(TEMPLATES, "gpulab-f00dfeed0001-gpu")
    validate_dra(template)
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    # Owned by the Job: the cluster deletes it with the Job, however the Job goes.
    [owner] = template["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Job", "gpulab-f00dfeed0001")
    job = server.get("/apis/batch/v1/namespaces/gpulab/jobs", "gpulab-f00dfeed0001")
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "gpulab-f00dfeed0001-gpu"}
    ]
    resources = pod["containers"][0]["resources"]
    assert resources.get("claims") == [{"name": "gpu"}]
    assert not [k for k in resources.get("limits", {}) if k.startswith("nvidia.com/")]
    validate_strict(job)
    await backend.start(spec, rows)  # started again after a crash: no error
    await backend.cancel(spec, grace_s=0)
    assert server.get(TEMPLATES, "gpulab-f00dfeed0001-gpu") is None


async def test_a_shared_card_is_one_claim_for_every_job_on_it(job_cluster):
    server, backend = await job_cluster(
        ("batch", "apps"), enforcement="dra", enforcement_options={"sharing": "mps"}, gpus=GPUS
    )
    rows = [{"gpu_uuid": UUID_A, "milli": 250, "node": "gpu-1"}]
    for job_id in ("f00dfeed0001", "f00dfeed0002"):
        await backend.start(job_spec(id=job_id), rows)
    name = "gpulab-gpu-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a"
    assert server.get(CLAIMS, name)["spec"]["devices"]["config"][0]["opaque"]["parameters"][
        "sharing"
    ] == {"strategy": "MPS"}
    for job_id in ("f00dfeed0001", "f00dfeed0002"):
        job = server.get("/apis/batch/v1/namespaces/gpulab/jobs", f"gpulab-{job_id}")
        assert job["spec"]["template"]["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": name}
        ]
    await backend.cancel(job_spec(), grace_s=0)
    assert server.get(CLAIMS, name) is not None  # the other job still uses the card
    # Ranks on two cards cannot share one card's claim: said before anything is sent.
    two = [{"gpu_uuid": UUID_A}, {"gpu_uuid": UUID_B}]
    with pytest.raises(EnforcementError, match="on 2 cards"):
        await backend.start(job_spec(id="f00dfeed0003", nodes=2), two)


async def test_an_endpoint_version_gets_a_claim_template(tmp_path):
    from kube_helpers import endpoint_unit, serving_on

    server = await FakeApiServer(("apps", "resource.k8s.io")).start()
    try:
        serving = serving_on(server, tmp_path, enforcement="dra", gpus=GPUS)
        dep = endpoint_unit(id="4a5b6c", replicas=2, gpu_milli=1000)
        serving.prepare(dep["id"])
        await serving.launch(dep, [{"gpu_uuid": UUID_A}, {"gpu_uuid": UUID_B}])
        template = server.get(TEMPLATES, "gpulab-ep-d4a5b6c-gpu")
        exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        assert (exactly["deviceClassName"], exactly["count"]) == ("gpu.nvidia.com", 1)
        deployment = server.get("/apis/apps/v1/namespaces/gpulab/deployments", "gpulab-ep-d4a5b6c")
        assert deployment["spec"]["template"]["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimTemplateName": "gpulab-ep-d4a5b6c-gpu"}
        ]
        await serving.launch(dep, [{"gpu_uuid": UUID_A}])  # adopted after a restart
        await serving.stop(dep, wait_s=0)
        assert server.get(TEMPLATES, "gpulab-ep-d4a5b6c-gpu") is None
    finally:
        await serving.close()
        await server.stop()


@pytest.fixture
async def spawner_api(tmp_path, kube):  # noqa: F811 (the fixture imported above)
    """A fake API server the spawner's client talks to, and the recorder of its pods."""
    from kubernetes_asyncio import client, config

    server = await FakeApiServer().start()
    api_client = await config.new_client_from_config(
        config_file=server.kubeconfig(tmp_path / "kubeconfig")
    )
    yield server, client.CoreV1Api(api_client)
    await api_client.close()
    await server.stop()


@pytest.mark.parametrize("sharing", ["mig", "mps"])
async def test_a_server_gets_its_claim_before_its_pod(
    service,  # noqa: F811
    kube,  # noqa: F811
    spawner_api,
    sharing,
    monkeypatch,
):
    from kubespawner import KubeSpawner

    server, api = spawner_api
    shared = "gpulab-gpu-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a"
    name = "jupyter-alice-gpu" if sharing == "mig" else shared
    # What the cluster holds when KubeSpawner creates the pod (the recorder's _start).
    held_at_pod: list[bool] = []
    create_pod = KubeSpawner._start

    async def claim_then_pod(self):
        held_at_pod.append(server.get(CLAIMS, name) is not None)
        return await create_pod(self)

    monkeypatch.setattr(KubeSpawner, "_start", claim_then_pod)
    spawner = make_spawner(service, "dra", sharing=sharing)
    spawner.api = api
    spawner.user_options = {"gpu_milli": 250}
    await spawner.start()
    assert held_at_pod == [True]
    pod = kube.pods[-1]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
    validate_strict(pod)
    assert [p for m, p, _ in server.requests if m == "POST"] == [CLAIMS]
    validate_dra(server.get(CLAIMS, name))
    container = pod["spec"]["containers"][0]["resources"]
    assert container["claims"] == [{"name": "gpu"}]
    assert not [k for k in container.get("limits") or {} if k.startswith("nvidia.com/")]
    await spawner.stop()
    # The server's own claim goes with it; a card's shared claim stays for the others.
    assert (server.get(CLAIMS, name) is None) == (sharing == "mig")


async def test_a_failed_server_start_leaves_no_claim(service, kube, spawner_api):  # noqa: F811
    server, api = spawner_api
    spawner = make_spawner(service, "dra")
    spawner.api = api
    spawner.user_options = {"gpu_milli": 1000}
    kube.fail_next = True
    with pytest.raises(TimeoutError):
        await spawner.start()
    assert [m for m, p, _ in server.requests if p.startswith(CLAIMS)] == ["POST", "DELETE"]
    assert server.get(CLAIMS, "jupyter-alice-gpu") is None
    assert service.calls[-1][0] == "DELETE"  # and the slice went back


# -- the chart ---------------------------------------------------------------------


def test_the_chart_grants_dra_rights_only_with_dra(chart):  # noqa: F811
    def allows(objects, kind, name, resource, verbs):
        return any(
            "resource.k8s.io" in r["apiGroups"]
            and resource in r["resources"]
            and set(verbs) <= set(r["verbs"])
            for r in objects.get(f"{kind}/{name}", {}).get("rules", [])
        )

    objects = render(chart, {**HUB_OFF, "enforcement": {"backend": "dra"}})
    # A template made, owned by its Job (patch), replaced by delete and create; a card's
    # shared claim only made (tests/kube/test_chart_rbac.py: exactly the code's calls).
    assert allows(
        objects, "Role", "gpulab", "resourceclaimtemplates", ["create", "delete", "patch"]
    )
    assert allows(objects, "Role", "gpulab", "resourceclaims", ["create"])
    assert allows(objects, "ClusterRole", "gpulab-gpulab-inventory", "resourceslices", ["list"])
    assert allows(objects, "Role", "gpulab-hub-dra", "resourceclaims", ["create", "delete"])
    binding = objects["RoleBinding/gpulab-hub-dra"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "gpulab"}]
    for key in ("Role/gpulab", "ClusterRole/gpulab-gpulab-inventory", "Role/gpulab-hub-dra"):
        validate_strict(objects[key])
    assert service_values_of(objects)["enforcement"]["backend"] == "dra"
    objects = render(chart, {**HUB_OFF, "enforcement": {"backend": "hami"}})
    assert not allows(objects, "Role", "gpulab", "resourceclaims", ["create"])
    assert "Role/gpulab-hub-dra" not in objects
