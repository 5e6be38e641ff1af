"""What keeps a job's and an endpoint's network their owner's on a cluster: pure functions.

Two objects per job, created before its pods and deleted with its Job (the
backend makes the Job their owner, so the garbage collector removes them with
it, also after ``ttlSecondsAfterFinished``):

- a Secret ``<job>-rdzv`` (key :data:`.pods.RDZV_SECRET_KEY`): the job's rendezvous secret,
  which the node container gets as ``$GPULAB_RDZV_SECRET`` (``secretKeyRef``;
  a pod's spec names the Secret, never the value). The rendezvous unpickles only
  states signed with it (:mod:`gpulab.training.rendezvous`).
- a NetworkPolicy ``<job>``: the job's pods take connections only from pods of
  the same job (the rendezvous store, rank 0's store, gloo and NCCL ports,
  anything the cell opens), and open them only to DNS, each other and addresses
  outside ``options.egress_blocked_cidrs`` (by default the cloud metadata server;
  :mod:`.egress`). It holds where the cluster's network plugin enforces
  NetworkPolicies (Calico, Cilium...; kindnet and flannel alone do not).

An endpoint's replicas get a NetworkPolicy of their own
(:func:`make_endpoint_network_policy`): calls only from the router's pods, and
out only to DNS (and the CIDRs the site names).
"""

from __future__ import annotations

from ..spec import JobSpec
from .deploy import ENDPOINT_LABEL, endpoint_name
from .egress import cidr_rules, dns_rule, outside_rules
from .pods import (
    JOB_ID_LABEL,
    RDZV_SECRET_KEY,
    JobOptions,
    common_labels,
    job_name,
    rdzv_secret_name,
)


def make_job_secret(spec: JobSpec, options: JobOptions, secret: str) -> dict:
    """The job's rendezvous secret (``secrets.token_hex(32)``, made by the backend)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": rdzv_secret_name(spec), "labels": common_labels(spec, options)},
        "type": "Opaque",
        "stringData": {RDZV_SECRET_KEY: secret},
    }


def make_job_network_policy(spec: JobSpec, options: JobOptions) -> dict:
    """Ingress to the job's pods only from the job's own pods; egress only to DNS, the
    job's own pods (every port: c10d, gloo, NCCL) and IPv4 addresses outside
    ``options.egress_blocked_cidrs``. The ranks write their logs, metrics and
    checkpoints to the jobs claim: they call no gpulab service."""
    own = {"matchLabels": {JOB_ID_LABEL: spec.id}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": job_name(spec), "labels": common_labels(spec, options)},
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": own}]}],
            "egress": [
                dns_rule(),
                {"to": [{"podSelector": own}]},
                *outside_rules(options.egress_blocked_cidrs),
            ],
        },
    }


def guard_objects(spec: JobSpec, options: JobOptions, secret: str) -> list[dict]:
    """``[Secret, NetworkPolicy]``: created before the job's own objects."""
    return [make_job_secret(spec, options, secret), make_job_network_policy(spec, options)]


def owned_by(owner: dict) -> dict:
    """The merge patch making ``owner`` (a created Job or JobSet) an object's owner."""
    meta = owner["metadata"]
    return {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ]
        }
    }


#: The pods an endpoint's replicas take calls from: the gpulab service's (its router),
#: as the chart labels them (``KubernetesServing(router_pod_labels=...)`` to change).
ROUTER_POD_LABELS = {"app.kubernetes.io/name": "gpulab", "app.kubernetes.io/component": "service"}


def make_endpoint_network_policy(
    name: str,
    *,
    port: int,
    router_pod_labels: dict | None = None,
    labels: dict | None = None,
    egress_cidrs: tuple[str, ...] | list[str] = (),
) -> dict:
    """Ingress to endpoint ``name``'s replicas (``gpulab.io/endpoint=<name>``) only from
    the router's pods, on the model server's port: no user's pod calls a replica
    directly (calls go through the router, which checks the caller's token). Egress
    only to DNS and ``egress_cidrs``: a model server loads its model from its volume
    and answers the router; it calls nothing."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": endpoint_name(name), "labels": dict(labels or {})},
        "spec": {
            "podSelector": {"matchLabels": {ENDPOINT_LABEL: name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [
                        {
                            "podSelector": {
                                "matchLabels": dict(router_pod_labels or ROUTER_POD_LABELS)
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": port}],
                }
            ],
            "egress": [dns_rule(), *cidr_rules(egress_cidrs, "egress_cidrs")],
        },
    }
