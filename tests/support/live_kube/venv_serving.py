"""The Kubernetes serving backend with this machine's venv in its replicas.

The live cluster's image has Python but neither torch nor gpulab (a layer of
gigabytes is not copied); a site's model-server image has both installed. The
chart's service, running in its pod on the live cluster, is given this class
(``service.extraConfig``: ``c.GpuLabService.serving_backend_class =
"venv_serving.VenvKubernetesServing"``, this folder on ``PYTHONPATH``), which adds
to each replica, after the service's own pod patch (the slice), what the suite's
other pods that need the venv get: this machine's ``/usr`` and the checkout
mounted read-only at the same paths, and the venv first on ``PATH``. The
objects, their names, the token Secret, the NetworkPolicy, the probes and the
calls are the backend's own.
"""

from __future__ import annotations

from pathlib import Path

from traitlets import default

from gpulab.backend.kubernetes.serving import KubernetesServing

REPO = Path(__file__).resolve().parents[3]


def with_venv(template: dict) -> dict:
    """``template`` with this machine's ``/usr`` and checkout mounted read-only and
    the venv's ``bin`` first on the server container's ``PATH``."""
    spec = template["spec"]
    spec.setdefault("volumes", []).extend(
        [
            {"name": "host-usr", "hostPath": {"path": "/usr", "type": "Directory"}},
            {"name": "gpulab-venv", "hostPath": {"path": str(REPO), "type": "Directory"}},
        ]
    )
    c = spec["containers"][0]
    c.setdefault("volumeMounts", []).extend(
        [
            {"name": "host-usr", "mountPath": "/usr", "readOnly": True},
            {"name": "gpulab-venv", "mountPath": str(REPO), "readOnly": True},
        ]
    )
    path = f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    c["env"] = [e for e in c.get("env", []) if e["name"] != "PATH"]
    c["env"].append({"name": "PATH", "value": path})
    return template


class VenvKubernetesServing(KubernetesServing):
    """:class:`KubernetesServing` whose replicas see this machine's venv."""

    @default("pod_patch_for")
    def _venv_patch_for(self):
        slice_patch_for = self.settings_pod_patch

        def patch_for(dep: dict, rows: list[dict]):
            slice_patch = slice_patch_for(dep, rows)
            return lambda t: with_venv(slice_patch(t) if slice_patch else t)

        return patch_for


__all__ = ["VenvKubernetesServing", "with_venv"]
