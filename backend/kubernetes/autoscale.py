"""An endpoint's autoscaler on the cluster: a HorizontalPodAutoscaler or a KEDA ScaledObject.

Pure builders. Both scale one unit's Deployment (one version of an endpoint) on
the requests in flight at the gpulab service's endpoint router, per replica: the
gauge ``gpulab_endpoint_inflight_requests{deployment, version, unit}`` the
service exports at ``<hub>/services/gpulab/metrics``. The replicas' own metrics
would miss the calls waiting for a replica, and there are none at zero replicas.

- :func:`make_hpa`: ``autoscaling/v2``, an *External* metric selected by
  ``unit=<id>``. The cluster's external metrics API must serve it (e.g.
  prometheus-adapter with a rule for the gauge; see
  ``docs/howto/endpoint-autoscaling-kubernetes.md``).
- :func:`make_scaled_object`: ``keda.sh/v1alpha1``, a ``prometheus`` trigger that
  asks Prometheus itself; KEDA can also scale to zero and back.

The count moves within ``[min_replicas, max_replicas]``: up without delay, down
only to the most needed over the last ``scale_down_delay_s`` seconds (the
HorizontalPodAutoscaler's stabilisation window, which the API caps at an hour).
"""

from __future__ import annotations

from ..spec import SpecError
from .deploy import ENDPOINT_LABEL
from .pods import COMMON_LABELS, USER_ANNOTATION

METRIC = "gpulab_endpoint_inflight_requests"
#: The label of the gauge naming the unit (one version of an endpoint).
UNIT_LABEL = "unit"
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
KEDA_PLURAL = "scaledobjects"
#: The longest stabilisation window the HorizontalPodAutoscaler API accepts.
MAX_WINDOW_S = 3600


def quantity(value: float) -> str:
    """``value`` as a Kubernetes quantity, exact to a thousandth: ``"4"``, ``"2500m"``."""
    milli = round(float(value) * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _settings(dep: dict) -> tuple[int, int, float, int]:
    """``(min, max, target, delay)`` of ``dep``; SpecError naming what is wrong."""
    low, high = dep["min_replicas"], dep["max_replicas"]
    target, delay = dep["target_inflight"], dep["scale_down_delay_s"]
    for what, v in (("min_replicas", low), ("max_replicas", high)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SpecError(f"{what!r} must be an integer >= 0, got {v!r}")
    if high < max(1, low):
        raise SpecError(f"'max_replicas' must be >= max(1, min_replicas), got {high!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0:
        raise SpecError(f"'target_inflight' must be a number > 0, got {target!r}")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise SpecError(f"'scale_down_delay_s' must be seconds >= 0, got {delay!r}")
    # Longer delays than the API allows are held to its most, not refused: the endpoint
    # still scales, only a little sooner than asked.
    return low, high, float(target), min(int(round(delay)), MAX_WINDOW_S)


def _metadata(name: str, dep: dict) -> dict:
    return {
        "name": name,
        "labels": {
            **COMMON_LABELS,
            "app.kubernetes.io/component": "endpoint",
            ENDPOINT_LABEL: f"d{dep['id']}",
        },
        "annotations": {USER_ANNOTATION: dep["user"]},
    }


def _behavior(delay: int) -> dict:
    # Up at once (a burst should not wait); down only to the most needed over the delay.
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0},
        "scaleDown": {"stabilizationWindowSeconds": delay},
    }


def _target(name: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def make_hpa(name: str, dep: dict, *, metric: str = METRIC) -> dict:
    """The HorizontalPodAutoscaler of Deployment ``name`` (unit ``dep``), named the same.

    It aims at ``target_inflight`` calls in flight per replica: the External
    metric ``metric`` of the unit, divided by the replicas running.
    """
    low, high, target, delay = _settings(dep)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(name, dep),
        "spec": {
            "scaleTargetRef": _target(name),
            # A plain HorizontalPodAutoscaler cannot scale to zero (minReplicas 0 needs
            # the HPAScaleToZero feature gate, off by default): at least one replica.
            "minReplicas": max(1, low),
            "maxReplicas": high,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": metric,
                            "selector": {"matchLabels": {UNIT_LABEL: dep["id"]}},
                        },
                        "target": {"type": "AverageValue", "averageValue": quantity(target)},
                    },
                }
            ],
            "behavior": _behavior(delay),
        },
    }


def inflight_query(dep: dict, metric: str = METRIC) -> str:
    """The PromQL of the unit's calls in flight, summed over the service's replicas."""
    return f'sum({metric}{{{UNIT_LABEL}="{dep["id"]}"}})'


def make_scaled_object(name: str, dep: dict, *, prometheus_url: str, metric: str = METRIC) -> dict:
    """The KEDA ScaledObject of Deployment ``name`` (unit ``dep``), named the same.

    KEDA makes and owns a HorizontalPodAutoscaler from it, and scales to zero
    (``min_replicas`` 0) and back from it on its own: a call waiting at the
    service's router counts as in flight.
    """
    low, high, target, delay = _settings(dep)
    if not prometheus_url:
        raise SpecError(
            "KEDA asks Prometheus for the calls in flight: set "
            "c.KubernetesServingSettings.prometheus_url"
        )
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": _metadata(name, dep),
        "spec": {
            "scaleTargetRef": _target(name),
            "minReplicaCount": low,
            "maxReplicaCount": high,
            # From the last replica to none: KEDA's own, the behavior below does N -> M.
            "cooldownPeriod": delay,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(delay)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": inflight_query(dep, metric),
                        "threshold": str(target),
                    },
                }
            ],
        },
    }
