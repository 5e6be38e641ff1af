"""The Kubernetes backend: a job as an Indexed Job (or a JobSet), an endpoint as a Deployment.

The objects come from pure functions, one module per kind of work; the
:class:`~.backend.KubernetesBackend` is the only module that talks to a cluster
(``kubernetes_asyncio``, imported when it is constructed, never at import):

- :mod:`.pods`: what every training pod shares: names, labels, the job volume,
  the torchrun container of a node (its rank comes from the pod's index);
- :mod:`.job`: ``make_job(spec, options) -> dict`` (an Indexed Job) and its headless
  Service; ``job_objects`` gives both, in the order to create them;
- :mod:`.jobset`: ``make_jobset(spec, options)`` when the JobSet CRD is installed;
- :mod:`.isolation`: ``make_job_secret`` (the rendezvous secret) and
  ``make_job_network_policy`` (ingress from the job's own pods only; egress to
  DNS, the job's own pods and addresses outside the blocked ranges, :mod:`.egress`),
  made before a job's pods and owned by its Job;
- :mod:`.pod_security`: who a job pod's or replica's code runs as, whatever its
  image says (a fixed non-root uid, no capabilities, no privilege escalation,
  seccomp), and the site's allow-list of job images;
- :mod:`.deploy`: ``make_deployment(...) -> [Deployment, Service]`` and, when
  KServe is installed, ``make_inference_service(...)``;
- :mod:`.autoscale`: ``make_hpa(name, dep)`` and ``make_scaled_object(name, dep, ...)``,
  an endpoint's autoscaler when the cluster decides its count (HPA or KEDA);
- :mod:`.serving`: :class:`KubernetesServing`, the model endpoints' I/O (a Secret, a
  Deployment and a Service per endpoint; ``kubernetes_asyncio`` imported when used);
- :mod:`.dra_claims`: under the ``dra`` enforcement backend, a job's or endpoint's
  ResourceClaimTemplate (or a card's shared ResourceClaim) sent before its pods;
  :mod:`.dra_inventory`: the GPUs as the DRA driver's ResourceSlices list them.

Slice enforcement and Kueue live in ``gpulab.enforcement.kube``, and the builders
take what they decide from the caller: ``pod_patch`` (a function of a pod template,
e.g. ``lambda t: apply_to_pod(t, pod_slice_patch("hami", GpuSlice.of(250, 81920)))``),
plain ``labels`` (``queue_patch("job", queue)["labels"]``) and ``priority_class``.
What depends on a job's own priority class (its PriorityClass ``gpulab-<class>``,
its Kueue WorkloadPriorityClass) comes per job through the backend's
``options_for`` (built from ``gpulab.enforcement.kube.kueue.class_patch``).
"""

from .autoscale import make_hpa, make_scaled_object
from .deploy import make_deployment, make_inference_service
from .isolation import guard_objects, make_job_network_policy, make_job_secret
from .job import job_objects, make_headless_service, make_job
from .jobset import make_jobset
from .pods import JobOptions, job_name
from .serving import KubernetesServing

__all__ = [
    "JobOptions",
    "KubernetesServing",
    "guard_objects",
    "job_name",
    "job_objects",
    "make_deployment",
    "make_headless_service",
    "make_hpa",
    "make_inference_service",
    "make_job",
    "make_job_network_policy",
    "make_job_secret",
    "make_jobset",
    "make_scaled_object",
]
