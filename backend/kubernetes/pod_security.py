"""What holds the users' code in a job's or a replica's pod, whatever image it names.

A job runs the image its user names (``spec.image``), and that image may say
``USER root``, carry setuid binaries, or expect capabilities. Every pod gpulab makes
for users' work therefore gets, from :class:`PodSecurity`:

- at the pod: ``runAsNonRoot``, a fixed ``runAsUser``/``runAsGroup`` (by default
  1000:100, the Jupyter images' ``jovyan``, and the uid the chart's service pod runs
  as, so the service and the ranks read each other's files on the shared claims),
  ``fsGroup`` (by default 1000, the service pod's: the kubelet gives the claim the
  same group for both; ``fsGroupChangePolicy: OnRootMismatch``, so a pod's start
  does not walk every job's files) and the runtime's default seccomp profile;
- at the container: ``allowPrivilegeEscalation: false`` and every capability
  dropped (no ``NET_RAW``, no ``CHOWN``, no ``SETUID``...).

That is Kubernetes' "restricted" Pod Security Standard for what a pod decides
itself. The same module checks a job's image against the site's allow-list
(:func:`check_image`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from ..spec import SpecError


@dataclass(frozen=True)
class PodSecurity:
    """Who users' code runs as in a pod: ``run_as_user`` and ``run_as_group`` (None:
    the image's own, which must then be a numeric uid other than 0), ``fs_group``
    (None: no fsGroup)."""

    run_as_user: int | None = 1000
    run_as_group: int | None = 100
    fs_group: int | None = 1000

    def __post_init__(self):
        for name in ("run_as_user", "run_as_group", "fs_group"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31
            ):
                raise SpecError(f"{name} must be a uid/gid from 0 to 2^31-1, got {value!r}")
        if self.run_as_user == 0:
            raise SpecError(
                "run_as_user must not be 0: users' code never runs as root in gpulab's pods "
                "(runAsNonRoot); use a uid the image's files allow, e.g. 1000"
            )

    def pod_context(self) -> dict:
        """The pod's ``securityContext``."""
        context: dict = {"runAsNonRoot": True}
        if self.run_as_user is not None:
            context["runAsUser"] = self.run_as_user
        if self.run_as_group is not None:
            context["runAsGroup"] = self.run_as_group
        if self.fs_group is not None:
            context["fsGroup"] = self.fs_group
            context["fsGroupChangePolicy"] = "OnRootMismatch"
        context["seccompProfile"] = {"type": "RuntimeDefault"}
        return context

    def apply(self, pod_spec: dict) -> dict:
        """``pod_spec`` (changed in place, and returned) with the pod's and every
        container's security contexts."""
        pod_spec["securityContext"] = self.pod_context()
        for container in pod_spec.get("containers") or []:
            container["securityContext"] = container_context()
        return pod_spec


def container_context() -> dict:
    """The ``securityContext`` of every job and replica container (a new dict)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


#: Who users' code runs as unless a site says otherwise: 1000:100, fsGroup 1000.
DEFAULT_POD_SECURITY = PodSecurity()


def check_image(image: str, allowed: tuple[str, ...] | list[str]) -> None:
    """SpecError unless ``image`` matches one of the glob patterns ``allowed``
    (``fnmatch``, case-sensitive; ``*`` matches ``/`` too); none: any image."""
    if not allowed:
        return
    if any(fnmatch.fnmatchcase(image, pattern) for pattern in allowed):
        return
    names = ", ".join(repr(p) for p in allowed)
    raise SpecError(
        f"image {image!r} is not allowed on this site: a job's image must match one of "
        f"{names} (c.KubernetesJobsSettings.allowed_images; the chart's "
        f"jobs.kubernetes.allowedImages)"
    )
