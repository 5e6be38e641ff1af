"""What a site allows its users' endpoints (`%deploy`) and where their router listens:
``c.Endpoints.*`` in the service's config, read by
:class:`~gpulab.service.endpoints.manager.DeploymentManager`. (The largest request
body, ``c.GpuLabService.max_upload_mib``, is the service's: every route reads it.)"""

from __future__ import annotations

import os

from traitlets import Bool, Float, Int, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ..setting_checks import positive, tcp_port, zero_or_more
from .autoscale import MAX_SCALE_DOWN_DELAY_S


class Endpoints(Configurable):
    """Deployments' limits, cold starts, and the endpoint router's address."""

    deployments_stop_with_server = Bool(
        False,
        help="""Stop a user's deployments when their (default) server stops, unless the
        deployment says otherwise (`%deploy --stop-with-server` / `--keep-running`).

        c.Endpoints.deployments_stop_with_server = True
        """,
    ).tag(config=True)

    endpoint_cold_start_seconds = Float(
        180.0,
        help="""How long a call to an endpoint scaled to zero (`%deploy --replicas 0:N`)
        waits for its first replica to answer before it gets 503 with Retry-After.

        c.Endpoints.endpoint_cold_start_seconds = 300
        """,
    ).tag(config=True)

    proxy_api_url = Unicode(
        help="""The REST API of the hub's configurable-http-proxy. With it (and the
        proxy's token in the service's environment as CONFIGPROXY_AUTH_TOKEN) the service
        routes endpoint calls from the proxy to its endpoint router, a lighter front door
        than its own routes; without it the service's routes answer them. `gpulab up`
        sets both; default: $GPULAB_PROXY_API_URL.

        c.Endpoints.proxy_api_url = "http://proxy-api:8001"
        """,
    ).tag(config=True)

    endpoint_router_ip = Unicode(
        "127.0.0.1",
        help="""Where the endpoint router listens (see proxy_api_url).

        c.Endpoints.endpoint_router_ip = "0.0.0.0"
        """,
    ).tag(config=True)

    endpoint_router_port = Int(
        0,
        help="""The endpoint router's port; 0: one the system picks.

        c.Endpoints.endpoint_router_port = 8082
        """,
    ).tag(config=True)

    endpoint_router_url = Unicode(
        "",
        help="""The URL the proxy sends endpoint calls to, where it differs from
        http://<endpoint_router_ip>:<port> (another host, a Kubernetes Service).

        c.Endpoints.endpoint_router_url = "http://gpulab-service:8082"
        """,
    ).tag(config=True)

    max_model_mib = Int(
        4096,
        help="""Largest model a `%deploy` upload may unpack to, in MiB (model.pt2 and
        model.json together, as the archive declares them). A small .tar.xz can expand to
        gigabytes; it is refused (413) before it is unpacked, and nothing is kept.

        c.Endpoints.max_model_mib = 16384
        """,
    ).tag(config=True)

    model_storage_quota_mib = Int(
        8192,
        help="""What one user's models may hold on disk together, in MiB: every version of
        every deployment of theirs, counted as unpacked (a 1 MB gzip can unpack to a GiB),
        not as uploaded. An upload that would pass it is refused (413, with the numbers)
        before a byte of it is unpacked, and nothing of it is kept; stopping a deployment
        gives its room back. Each model is also bounded by max_model_mib.

        c.Endpoints.model_storage_quota_mib = 32768
        """,
    ).tag(config=True)

    max_deployment_replicas = Int(
        4,
        help="""Most replicas one deployment may ask for (`%deploy --replicas`).

        c.Endpoints.max_deployment_replicas = 8
        """,
    ).tag(config=True)

    min_gpu_scale_down_delay_s = Float(
        60.0,
        help="""The shortest scale-down delay of an endpoint version that holds GPU slices,
        in seconds, whatever the deployment asks (`%deploy --scale-down-delay`, up to
        3600). With 0 a GPU endpoint scaled to zero (`--replicas 0:N`) gives its slice back
        after each call and takes one again at the next, preempting other users' batch
        jobs that borrowed the GPU meanwhile, over and over. CPU endpoints keep what
        they ask.

        c.Endpoints.min_gpu_scale_down_delay_s = 300
        """,
    ).tag(config=True)

    max_user_deployments = Int(
        5,
        help="""Most deployments one user may have at once (failed ones count until stopped).

        c.Endpoints.max_user_deployments = 10
        """,
    ).tag(config=True)

    @default("proxy_api_url")
    def _default_proxy_api_url(self):
        return os.environ.get("GPULAB_PROXY_API_URL", "")

    @validate(
        "endpoint_cold_start_seconds",
        "max_model_mib",
        "model_storage_quota_mib",
        "max_deployment_replicas",
    )
    def _positive(self, proposal):
        return positive(proposal)

    @validate("max_user_deployments")
    def _zero_or_more(self, proposal):
        return zero_or_more(proposal, "no deployments")

    @validate("min_gpu_scale_down_delay_s")
    def _delay_floor(self, proposal):
        if proposal.value > MAX_SCALE_DOWN_DELAY_S:
            raise TraitError(
                f"c.Endpoints.min_gpu_scale_down_delay_s must be from 0 to "
                f"{MAX_SCALE_DOWN_DELAY_S:g} (the longest scale-down delay), got {proposal.value}"
            )
        return zero_or_more(proposal, "as each deployment asks")

    @validate("endpoint_router_port")
    def _port(self, proposal):
        return tcp_port(proposal)
