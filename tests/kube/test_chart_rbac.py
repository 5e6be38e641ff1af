"""The chart's RBAC is exactly what gpulab's code calls: no call without a rule, no rule
without a call.

Two checks, one from each side:

- **the source**: every Kubernetes API method named in the code that runs as the
  chart's ServiceAccounts (the service: ``backend/kubernetes/*.py``; the hub's DRA
  claims: ``spawner/kube.py``) is in :data:`CALLS`, which says which resource and verb
  each one is (``replace_*`` is ``update``; the generic ``*_custom_object`` calls name
  every resource that file sends them for). A new call the table does not know fails
  here, and so does a call whose rule is missing from the rendered Role; a rule no
  call needs fails too.
- **the wire**: the backends run their jobs and endpoints (Job, JobSet, Kueue, DRA,
  elastic resizes, HPA and KEDA autoscalers, logs, stops) against the fake API server
  (``fake_apiserver``: real HTTP, the real ``kubernetes_asyncio`` client), which records
  every request; each is turned into (group, resource, verb) from its method and path
  and must be in :data:`CALLS` and allowed by the rendered Role.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from aiohttp import web
from fake_apiserver import FakeApiServer
from kube_helpers import endpoint_unit, serving_on
from test_chart import HUB_OFF, chart, render  # noqa: F401 (a fixture)

from gpulab.backend.kubernetes.backend import KubernetesBackend
from gpulab.backend.spec import JobSpec
from gpulab.scheduler.inventory import Gpu

ROOT = Path(__file__).resolve().parents[2]
CORE, BATCH, APPS, NET = "", "batch", "apps", "networking.k8s.io"
DRA, JOBSET, KUEUE, KEDA, HPA = (
    "resource.k8s.io",
    "jobset.x-k8s.io",
    "kueue.x-k8s.io",
    "keda.sh",
    "autoscaling",
)

#: (file, API method) -> what it does: {(group, resource, verb)}. Empty: no rule needed
#: (API discovery, GET /apis, is every authenticated user's).
CALLS: dict[tuple[str, str], set[tuple[str, str, str]]] = {
    # -- the job backend ----------------------------------------------------------------
    ("backend/kubernetes/backend.py", "get_api_versions"): set(),
    ("backend/kubernetes/backend.py", "create_namespaced_custom_object"): {
        (DRA, "resourceclaims", "create"),
        (DRA, "resourceclaimtemplates", "create"),
        (JOBSET, "jobsets", "create"),
    },
    ("backend/kubernetes/backend.py", "create_namespaced_secret"): {(CORE, "secrets", "create")},
    ("backend/kubernetes/backend.py", "create_namespaced_network_policy"): {
        (NET, "networkpolicies", "create")
    },
    ("backend/kubernetes/backend.py", "create_namespaced_service"): {(CORE, "services", "create")},
    ("backend/kubernetes/backend.py", "create_namespaced_job"): {(BATCH, "jobs", "create")},
    ("backend/kubernetes/backend.py", "patch_namespaced_secret"): {(CORE, "secrets", "patch")},
    ("backend/kubernetes/backend.py", "patch_namespaced_network_policy"): {
        (NET, "networkpolicies", "patch")
    },
    ("backend/kubernetes/backend.py", "patch_namespaced_service"): {(CORE, "services", "patch")},
    ("backend/kubernetes/backend.py", "patch_namespaced_custom_object"): {
        (DRA, "resourceclaimtemplates", "patch"),
        (JOBSET, "jobsets", "patch"),
    },
    ("backend/kubernetes/backend.py", "get_namespaced_custom_object"): {(JOBSET, "jobsets", "get")},
    ("backend/kubernetes/backend.py", "read_namespaced_job"): {(BATCH, "jobs", "get")},
    ("backend/kubernetes/backend.py", "list_namespaced_custom_object"): {
        (KUEUE, "workloads", "list")
    },
    ("backend/kubernetes/backend.py", "patch_namespaced_job"): {(BATCH, "jobs", "patch")},
    ("backend/kubernetes/backend.py", "delete_namespaced_custom_object"): {
        (JOBSET, "jobsets", "delete")
    },
    ("backend/kubernetes/backend.py", "delete_namespaced_job"): {(BATCH, "jobs", "delete")},
    ("backend/kubernetes/backend.py", "delete_namespaced_service"): {(CORE, "services", "delete")},
    ("backend/kubernetes/backend.py", "delete_namespaced_secret"): {(CORE, "secrets", "delete")},
    ("backend/kubernetes/backend.py", "delete_namespaced_network_policy"): {
        (NET, "networkpolicies", "delete")
    },
    # -- DRA claims (jobs and endpoints) ------------------------------------------------
    ("backend/kubernetes/dra_claims.py", "create_namespaced_custom_object"): {
        (DRA, "resourceclaims", "create"),
        (DRA, "resourceclaimtemplates", "create"),
    },
    # A template is replaced by delete and create; a card's shared claim is never deleted.
    ("backend/kubernetes/dra_claims.py", "delete_namespaced_custom_object"): {
        (DRA, "resourceclaimtemplates", "delete")
    },
    # -- the serving backend ------------------------------------------------------------
    ("backend/kubernetes/serving.py", "create_namespaced_secret"): {(CORE, "secrets", "create")},
    ("backend/kubernetes/serving.py", "replace_namespaced_secret"): {(CORE, "secrets", "update")},
    ("backend/kubernetes/serving.py", "create_namespaced_network_policy"): {
        (NET, "networkpolicies", "create")
    },
    ("backend/kubernetes/serving.py", "replace_namespaced_network_policy"): {
        (NET, "networkpolicies", "update")
    },
    ("backend/kubernetes/serving.py", "create_namespaced_deployment"): {
        (APPS, "deployments", "create")
    },
    ("backend/kubernetes/serving.py", "replace_namespaced_deployment"): {
        (APPS, "deployments", "update")
    },
    ("backend/kubernetes/serving.py", "create_namespaced_service"): {(CORE, "services", "create")},
    ("backend/kubernetes/serving.py", "patch_namespaced_service"): {(CORE, "services", "patch")},
    ("backend/kubernetes/serving.py", "create_namespaced_horizontal_pod_autoscaler"): {
        (HPA, "horizontalpodautoscalers", "create")
    },
    ("backend/kubernetes/serving.py", "replace_namespaced_horizontal_pod_autoscaler"): {
        (HPA, "horizontalpodautoscalers", "update")
    },
    ("backend/kubernetes/serving.py", "delete_namespaced_horizontal_pod_autoscaler"): {
        (HPA, "horizontalpodautoscalers", "delete")
    },
    ("backend/kubernetes/serving.py", "create_namespaced_custom_object"): {
        (KEDA, "scaledobjects", "create")
    },
    ("backend/kubernetes/serving.py", "get_namespaced_custom_object"): {
        (KEDA, "scaledobjects", "get")
    },
    ("backend/kubernetes/serving.py", "replace_namespaced_custom_object"): {
        (KEDA, "scaledobjects", "update")
    },
    ("backend/kubernetes/serving.py", "delete_namespaced_custom_object"): {
        (KEDA, "scaledobjects", "delete")
    },
    ("backend/kubernetes/serving.py", "patch_namespaced_deployment"): {
        (APPS, "deployments", "patch")
    },
    ("backend/kubernetes/serving.py", "read_namespaced_deployment"): {(APPS, "deployments", "get")},
    ("backend/kubernetes/serving.py", "list_namespaced_pod"): {(CORE, "pods", "list")},
    ("backend/kubernetes/serving.py", "read_namespaced_pod_log"): {(CORE, "pods/log", "get")},
    ("backend/kubernetes/serving.py", "delete_namespaced_deployment"): {
        (APPS, "deployments", "delete")
    },
    ("backend/kubernetes/serving.py", "delete_namespaced_service"): {(CORE, "services", "delete")},
    ("backend/kubernetes/serving.py", "delete_namespaced_secret"): {(CORE, "secrets", "delete")},
    ("backend/kubernetes/serving.py", "delete_namespaced_network_policy"): {
        (NET, "networkpolicies", "delete")
    },
    # -- the GPU inventory (cluster-scoped: the ClusterRole) -----------------------------
    ("backend/kubernetes/inventory.py", "list_node"): {(CORE, "nodes", "list")},
    ("backend/kubernetes/dra_inventory.py", "list_node"): {(CORE, "nodes", "list")},
    ("backend/kubernetes/dra_inventory.py", "list_cluster_custom_object"): {
        (DRA, "resourceslices", "list")
    },
    # -- the hub's spawner under dra (z2jh's hub ServiceAccount: Role gpulab-hub-dra) ----
    ("spawner/kube.py", "create_namespaced_custom_object"): {(DRA, "resourceclaims", "create")},
    ("spawner/kube.py", "delete_namespaced_custom_object"): {(DRA, "resourceclaims", "delete")},
}
#: Whose rights each file's calls use: the service's ServiceAccount, or the hub's.
HUB_FILES = {"spawner/kube.py"}

#: A Kubernetes client method, named or called (``core.replace_namespaced_secret``).
API_METHOD = re.compile(
    r"\.((?:create|read|get|list|patch|replace|delete|connect|watch)_"
    r"(?:namespaced|cluster)_[a-z_]+|list_node|get_api_versions|[a-z_]+_for_all_namespaces)\b"
)


def source_calls() -> set[tuple[str, str]]:
    files = sorted((ROOT / "backend" / "kubernetes").glob("*.py")) + [ROOT / "spawner/kube.py"]
    found = set()
    for path in files:
        rel = str(path.relative_to(ROOT))
        for m in API_METHOD.finditer(path.read_text()):
            found.add((rel, m.group(1)))
    return found


def granted(objects: dict, *names: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule of the Roles/ClusterRoles ``names``."""
    out = set()
    for name in names:
        for rule in objects[name]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(group, resource, verb) for verb in rule["verbs"]}
    return out


def service_rights(chart, autoscaler: str) -> set[tuple[str, str, str]]:  # noqa: F811
    values = {**HUB_OFF, "enforcement": {"backend": "dra"}}
    endpoints = {"enabled": True, "autoscaler": autoscaler}
    if autoscaler == "keda":
        endpoints["prometheusUrl"] = "http://prometheus.monitoring.svc:9090"
    objects = render(chart, {**values, "deployments": {"kubernetes": endpoints}})
    return granted(objects, "Role/gpulab", "ClusterRole/gpulab-gpulab-inventory")


@pytest.fixture(scope="module")
def rights(chart):  # noqa: F811
    """What the chart grants the service (every option on: DRA, and HPA or KEDA, which
    exclude each other) and the hub (its DRA Role)."""
    hub = render(chart, {**HUB_OFF, "enforcement": {"backend": "dra"}})
    return {
        "service": service_rights(chart, "hpa") | service_rights(chart, "keda"),
        "hub": granted(hub, "Role/gpulab-hub-dra"),
    }


def test_every_api_call_in_the_code_is_known():
    """A call the table does not know fails here: give it a line in CALLS and its rule
    in helm/gpulab/templates/rbac.yaml."""
    found = source_calls()
    unknown = sorted(found - set(CALLS))
    assert not unknown, f"Kubernetes API calls with no RBAC line in CALLS: {unknown}"
    gone = sorted(set(CALLS) - found)
    assert not gone, f"CALLS names calls the code no longer makes: {gone}"


def test_the_roles_grant_every_call_and_nothing_else(rights):
    needs = {"service": set(), "hub": set()}
    for (path, _), what in CALLS.items():
        needs["hub" if path in HUB_FILES else "service"] |= what
    for who in ("service", "hub"):
        missing = sorted(needs[who] - rights[who])
        assert not missing, f"the {who}'s code calls what its Role does not grant: {missing}"
        extra = sorted(rights[who] - needs[who])
        assert not extra, f"the {who}'s Role grants what no call needs: {extra}"


def test_no_secret_configmap_claim_or_cluster_pod_is_readable(rights):
    """What a leaked service token reads: never a Secret (other users' rendezvous and
    endpoint tokens, the hub's), a ConfigMap, a claim, or another namespace's pods."""
    service = rights["service"]
    for resource in ("secrets", "configmaps", "persistentvolumeclaims"):
        assert not {v for g, r, v in service if (g, r) == ("", resource)} & {
            "get",
            "list",
            "watch",
        }, resource
    assert ("", "pods", "watch") not in service and ("", "pods", "get") not in service


# -- the wire: what the backends send, recorded ------------------------------------------
class RecordingApiServer(FakeApiServer):
    """The fake API server, also answering a list (``GET`` of a collection) with the
    objects under it and a pod's log, as the API server does."""

    async def _objects(self, request):
        path = "/" + request.match_info["path"]
        if request.method == "GET" and path.endswith("/log"):
            self.requests.append(("GET", path, None))
            return web.Response(text="a line of the replica's log\n")
        group, resource, name = parse(path)
        if request.method == "GET" and name is None:
            self.requests.append(("GET", path, None))
            items = [o for k, o in self.objects.items() if k.rsplit("/", 1)[0] == path]
            return web.json_response(
                {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
            )
        return await super()._objects(request)


def parse(path: str) -> tuple[str, str, str | None]:
    """(group, resource[/subresource], name or None) of an API path."""
    parts = path.split("?")[0].strip("/").split("/")
    if parts[0] == "api":  # /api/v1/...
        group, rest = "", parts[2:]
    else:  # /apis/<group>/<version>/...
        group, rest = parts[1], parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    return group, resource, name


VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def recorded(server) -> set[tuple[str, str, str]]:
    out = set()
    for method, path, _ in server.requests:
        if path.rstrip("/") == "/apis":
            continue  # discovery
        group, resource, name = parse(path)
        verb = VERBS.get(method) or ("get" if name is not None else "list")
        if resource.endswith("/log"):
            resource, verb = "pods/log", "get"
        out.add((group, resource, verb))
    return out


H100 = "NVIDIA H100 80GB HBM3"
GPUS = [
    Gpu("GPU-8f6e2a51-0b5c-4c8e-9d3a-1f0e2d3c4b5a", 0, H100, 81559, "gpu-1"),
    Gpu("GPU-2d1c0b9a-8e7f-4a6b-9c5d-0e1f2a3b4c5d", 1, H100, 81559, "gpu-1"),
]


def job(job_id: str, **kw) -> JobSpec:
    fields = dict(
        code="print(1)",
        nodes=2,
        image="registry.example/gpulab:1",
        id=job_id,
        user="ann",
        backend="kubernetes",
    )
    fields.update(kw)
    s = JobSpec(**fields)
    s.validate()
    return s


async def run_jobs(tmp_path) -> set[tuple[str, str, str]]:
    """Jobs through their whole lives on each kind of cluster the backend meets."""
    seen = set()
    for n, (groups, settings) in enumerate(
        [
            (("batch", "apps"), {}),  # an Indexed Job
            (("batch", "apps", JOBSET), {}),  # a JobSet
            (("batch", "apps"), {"queue": "gpulab"}),  # queued in Kueue
            (("batch", "apps"), {"enforcement": "dra", "enforcement_options": {"sharing": "mig"}}),
            (("batch", "apps"), {"enforcement": "dra", "enforcement_options": {"sharing": "mps"}}),
        ]
    ):
        server = await RecordingApiServer(groups).start()
        backend = KubernetesBackend(
            str(tmp_path / f"jobs{n}"),
            namespace="gpulab",
            jobs_pvc="gpulab-jobs",
            kubeconfig=server.kubeconfig(tmp_path / f"kubeconfig{n}"),
            gpus=GPUS,
            **settings,
        )
        if "enforcement" not in settings:
            backend.pod_patch_for = None
        try:
            spec = job(f"a1b2c3d4e5f{n}", min_nodes=1, max_nodes=3, nodes=2)
            rows = [{"gpu_uuid": GPUS[0].uuid, "milli": 250, "node": "gpu-1"}] * 2
            if "enforcement" in settings:
                spec = job(f"a1b2c3d4e5f{n}", nodes=1, gpu_milli=250)
                rows = rows[:1]
            await backend.start(spec, rows)
            await backend.poll(spec)
            await backend.start(spec, rows)  # again, after a crash: the run stays
            if spec.elastic:
                await backend.resize(spec, 3, rows)
            await backend.cancel(spec, grace_s=0)
        finally:
            await backend.close()
            await server.stop()
        seen |= recorded(server)
    return seen


async def run_endpoints(tmp_path) -> set[tuple[str, str, str]]:
    """Endpoints launched, launched again (the service restarted), scaled, checked, their
    logs read and stopped, with each autoscaler, and under DRA."""
    seen = set()
    unit = endpoint_unit(
        id="0a1b2c3d4e5f",
        replicas=1,
        min_replicas=0,
        max_replicas=4,
        target_inflight=2.5,
        scale_down_delay_s=90.0,
    )
    for n, settings in enumerate(
        [
            {"autoscaler": "hpa"},
            {"autoscaler": "keda", "prometheus_url": "http://prometheus.monitoring.svc:9090"},
            {"enforcement": "dra", "gpus": GPUS},
        ]
    ):
        server = await RecordingApiServer(("apps", DRA)).start()
        folder = tmp_path / f"serving{n}"
        folder.mkdir()
        serving = serving_on(server, folder, **settings)
        if "enforcement" not in settings:
            serving.pod_patch_for = None
        serving.prepare(unit["id"])
        rows = [{"gpu_uuid": GPUS[0].uuid, "milli": 250, "node": "gpu-1"}]
        try:
            await serving.launch(unit, rows)
            await serving.launch(unit, rows)
            await serving.scale(unit, 2, rows)
            await serving.check(unit)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "replica-0"}}
            server.objects["/api/v1/namespaces/gpulab/pods/replica-0"] = pod
            assert "replica's log" in await serving.logs(unit, 0)
            await serving.stop(unit, wait_s=0)
        finally:
            await serving.close()
            await server.stop()
        seen |= recorded(server)
    return seen


async def run_inventory(tmp_path) -> set[tuple[str, str, str]]:
    from gpulab.backend.kubernetes.dra_inventory import fetch_resource_slices
    from gpulab.backend.kubernetes.inventory import fetch_nodes

    server = await RecordingApiServer(("apps", DRA)).start()
    try:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig-inventory")
        await fetch_nodes(kubeconfig)
        await fetch_resource_slices(kubeconfig, label_selector="pool=big")
    finally:
        await server.stop()
    return recorded(server)


async def test_what_the_backends_send_is_known_and_granted(tmp_path, rights):
    sent = set()
    for run in (run_jobs, run_endpoints, run_inventory):
        sent |= await run(tmp_path)
    known = set().union(*(what for (path, _), what in CALLS.items() if path not in HUB_FILES))
    assert sorted(sent - known) == [], "requests CALLS does not list"
    assert sorted(sent - rights["service"]) == [], "requests the chart's Role refuses"
    # The runs reach every line of the table: what the wire saw is the table.
    assert sorted(known - sent) == [], "lines of CALLS no run sends: exercise them here"


def test_the_recorder_reads_paths_as_the_api_server_does():
    assert parse("/api/v1/namespaces/gpulab/secrets/x") == ("", "secrets", "x")
    assert parse("/api/v1/namespaces/gpulab/pods") == ("", "pods", None)
    assert parse("/api/v1/namespaces/gpulab/pods/p/log?tailLines=5") == ("", "pods/log", "p")
    assert parse("/apis/batch/v1/namespaces/gpulab/jobs/j") == ("batch", "jobs", "j")
    assert parse("/api/v1/nodes") == ("", "nodes", None)
    assert parse("/apis/resource.k8s.io/v1/resourceslices") == (DRA, "resourceslices", None)
