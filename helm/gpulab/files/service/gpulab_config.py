# The gpulab service's configuration on Kubernetes, from the chart's values
# (a JSON file the chart mounts beside this one).
import json
import os

c = get_config()  # noqa: F821 (provided by traitlets' config loader)

with open(os.environ.get("GPULAB_SERVICE_VALUES", "/etc/gpulab/service-values.json")) as f:
    gpulab = json.load(f)

slices = gpulab["slices"]
c.InventorySettings.policy = slices["policy"]
c.InventorySettings.slice_sizes = [int(m) for m in slices["sizes"]]
c.SharingSettings.default_user_quota_milli = slices.get("defaultUserQuotaMilli")
c.SharingSettings.user_quota_milli = slices.get("userQuotaMilli") or {}
c.SharingSettings.group_quota_milli = slices.get("groupQuotaMilli") or {}
c.TelemetrySettings.authenticate_prometheus = bool(gpulab["authenticatePrometheus"])
# The annotation scrape's port: every series without a token, reached only by
# Prometheus (the chart's NetworkPolicy); 0 without the scrape.
c.TelemetrySettings.metrics_port = int(gpulab.get("metricsPort") or 0)
# Node agents sample the GPU nodes; the service's own pod has no GPU.
c.TelemetrySettings.local_sampler = False
# The service pod holds the hub's tokens and the database: jobs and endpoints
# run as pods of their own, and a job for the "local" backend is refused
# (unless the installer set service.allowUserCodeInServicePod).
c.GpuLabService.user_code_in_service = bool(gpulab.get("userCodeInServicePod", False))
# Hibernation: users' servers are reached through z2jh's proxy-public Service.
hibernation = gpulab.get("hibernation") or {}
c.Hibernation.hibernate_idle_seconds = float(hibernation.get("idleSeconds", 0))
c.Hibernation.hibernate_for_others_seconds = float(hibernation.get("forOthersSeconds", 300))
c.Hibernation.hibernate_max_bytes = int(hibernation.get("maxBytes", 20 * 10**9))
c.Hibernation.servers_url = hibernation.get("serversUrl") or "http://proxy-public"
# Vector collections: a Milvus cluster, or (no uri) the embedded engine in this pod.
c.VectorSettings.vector_engine_uri = (gpulab.get("vectors") or {}).get("uri") or ""
c.VectorSettings.vector_engine_token = os.environ.get("GPULAB_VECTOR_ENGINE_TOKEN", "")
# GPUs come from the cluster's nodes (gpulab.backend.kubernetes.inventory).
c.InventorySettings.inventory_source = "kubernetes"
c.KubernetesInventory.label_selector = gpulab.get("nodeLabelSelector") or ""
# With DRA the cards (real UUIDs) come from the DRA driver's ResourceSlices.
if gpulab["enforcement"]["backend"] == "dra":
    c.KubernetesInventory.source = "resourceslices"
# gpulab's priority classes: the same list the chart made PriorityClasses of.
c.SharingSettings.priority_classes = [
    {
        "name": item["name"],
        "value": int(item["value"]),
        "preemptible": bool(item.get("preemptible", False)),
        "access": item.get("access") or "everyone",
    }
    for item in (gpulab.get("priorityClasses") or {}).get("classes") or []
]


def slice_and_queue() -> dict:
    """What jobs and endpoints on Kubernetes share: how a pod holds its slice (the
    chart's enforcement backend), with Kueue on its queue and a fixed priority (if
    any), and the prefix of gpulab-<class>, the PriorityClass (and Kueue's
    WorkloadPriorityClass) of each one's own class when the chart made them."""
    kueue = gpulab.get("kueue") or {}
    queued = bool(kueue.get("enabled"))
    enforcement = gpulab["enforcement"]
    return {
        "enforcement": enforcement["backend"],
        "enforcement_options": enforcement.get("options") or {},
        "queue": (kueue.get("localQueue") or "") if queued else "",
        "priority": (kueue.get("defaultPriorityClass") or "") if queued else "",
        "priority_class_prefix": (gpulab.get("priorityClasses") or {}).get("prefix") or "",
    }


def pod_security(section, values: dict) -> None:
    """Who users' code runs as in the pods of ``section`` (c.KubernetesJobsSettings or
    c.KubernetesServingSettings): podSecurity's uid, gid and fsGroup; one left out
    (a value set to null, which helm removes) is the image's own, or no fsGroup."""
    security = values.get("podSecurity") or {}
    section.run_as_user = security.get("runAsUser")
    section.run_as_group = security.get("runAsGroup")
    section.fs_group = security.get("fsGroup")


# Jobs with backend "kubernetes" run as Indexed Jobs/JobSets in the release's
# namespace; the jobs directory (<data-dir>/jobs) is the claim the chart mounts
# there, and each job's pods mount that job's folder of it at the same path.
jobs = gpulab.get("kubernetesJobs") or {}
if jobs.get("enabled"):
    # Whatever image a job names: its pods run as podSecurity's uid, non-root, with
    # no capabilities; a site may hold jobs to its images, and keep their pods from
    # the cloud metadata server (and its private ranges).
    pod_security(c.KubernetesJobsSettings, jobs)
    c.KubernetesJobsSettings.allowed_images = list(jobs.get("allowedImages") or [])
    c.KubernetesJobsSettings.egress_blocked_cidrs = list(jobs.get("egressBlockedCIDRs") or [])
    c.GpuLabService.kubernetes_jobs = {
        "namespace": jobs["namespace"],
        "jobs_pvc": jobs["jobsPvc"],
        **slice_and_queue(),
        "priority_class": jobs.get("priorityClassName") or "",
        "use_jobset": jobs.get("useJobSet", "auto"),
        "rdzv_port": int(jobs.get("rdzvPort") or 29400),
    }

# Endpoints (%deploy) run as a Deployment and a Service each in the release's
# namespace; the deployments directory (<data-dir>/deployments) is the claim
# the chart mounts there, and every model-server pod mounts it at the same path.
deployments = gpulab.get("kubernetesDeployments") or {}
if deployments.get("enabled"):
    endpoints = {
        "namespace": deployments["namespace"],
        "models_pvc": deployments["modelsPvc"],
        "image": deployments["image"],
        **slice_and_queue(),
        "priority_class": deployments.get("priorityClassName") or "",
        # Who scales endpoints between MIN and MAX: the service, an HPA or KEDA.
        "autoscaler": deployments.get("autoscaler") or "service",
        "prometheus_url": deployments.get("prometheusUrl") or "",
    }
    if deployments.get("tlsSecret"):  # tls.internal: replicas serve https with its certificate
        endpoints["tls_secret"] = deployments["tlsSecret"]
    c.GpuLabService.kubernetes_deployments = endpoints
    # A replica runs its owner's model: podSecurity's uid, non-root, no capabilities;
    # out only to DNS (and the ranges the values name).
    pod_security(c.KubernetesServingSettings, deployments)
    c.KubernetesServingSettings.egress_cidrs = list(deployments.get("egressCIDRs") or [])
