# gpulab's part of the hub configuration, loaded by z2jh's jupyterhub_config.py
# from /usr/local/etc/jupyterhub/jupyterhub_config.d/. It reads the chart's
# values from a JSON file the chart mounts beside it; nothing here is pasted
# into values.yaml. The hub image needs gpulab installed (`pip install gpulab[kubernetes]`).
# The services, roles and hooks are gpulab.hub_ext.gpulab_hub's, the same `gpulab up`
# writes; this file only adds what is the chart's own: the Kubernetes spawner.
import json
import os

from gpulab.hub_ext.gpulab_hub import add_gpulab_to_hub, add_mlflow_to_hub

c = get_config()  # noqa: F821 (provided by JupyterHub)

with open(os.environ.get("GPULAB_HUB_VALUES", "/usr/local/etc/gpulab/hub-values.json")) as f:
    gpulab = json.load(f)

service_token = os.environ["GPULAB_SERVICE_TOKEN"]

c.JupyterHub.spawner_class = "gpulab-kube"
c.FractionalKubeSpawner.gpulab_api_url = gpulab["apiUrl"]
c.FractionalKubeSpawner.gpulab_public_api_url = gpulab["publicApiUrl"]
c.FractionalKubeSpawner.gpulab_api_token = service_token
c.FractionalKubeSpawner.enforcement = gpulab["enforcement"]["backend"]
c.FractionalKubeSpawner.enforcement_options = gpulab["enforcement"].get("options") or {}
c.FractionalKubeSpawner.notebook_priority_class = gpulab.get("notebookPriorityClass") or ""

# The service runs in its own pod (no command: the hub does not start it). Idle
# servers are culled by z2jh's own culler (its `cull` values), already configured.
add_gpulab_to_hub(
    c,
    service_name=gpulab["serviceName"],
    service_url=gpulab["serviceUrl"],
    api_url=gpulab["apiUrl"],
    service_token=service_token,
    # The node agents (the DaemonSet) push telemetry as their own service.
    agent_service_name=gpulab["agentServiceName"],
    agent_token=os.environ["GPULAB_AGENT_TOKEN"],
)

# MLflow behind the hub (the chart's mlflow Deployment), its token from gpulab-tokens.
if gpulab.get("mlflowUrl"):
    add_mlflow_to_hub(
        c,
        service_url=gpulab["mlflowUrl"],
        service_token=os.environ["GPULAB_MLFLOW_TOKEN"],
        gpulab_service_name=gpulab["serviceName"],
    )
    c.FractionalKubeSpawner.mlflow_tracking_uri = gpulab["publicMlflowUrl"]
