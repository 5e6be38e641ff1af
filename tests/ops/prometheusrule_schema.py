"""The JSON schema of a PrometheusRule (``monitoring.coreos.com/v1``), for offline checks.

kubernetes-validate ships schemas for Kubernetes' own kinds only, and the Prometheus
Operator's CRD cannot be fetched from here. This is the ``openAPIV3Schema`` of its CRD
``prometheusrules.monitoring.coreos.com`` (prometheus-operator 0.82.2,
``example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml``),
written out with its descriptions left out, ``x-kubernetes-int-or-string`` as the
``anyOf`` the CRD gives beside it, ``^(?i)`` as ``(?i)^`` (Python's ``re``
wants its flags first), and one thing added: ``additionalProperties: false``
on every object whose fields the CRD lists, so a misspelt field fails here (the API
server would silently prune it). The object's metadata is checked separately, with
kubernetes-validate, as a ConfigMap's.
"""

DURATION = {
    "type": "string",
    "pattern": (
        r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
        r"(([0-9]+)ms)?)$"
    ),
}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "properties": {
        "alert": {"type": "string"},
        "annotations": _STR_MAP,
        "expr": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "for": DURATION,
        "keep_firing_for": {**DURATION, "minLength": 1},
        "labels": _STR_MAP,
        "record": {"type": "string"},
    },
}

GROUP = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "interval": DURATION,
        "labels": _STR_MAP,
        "limit": {"type": "integer"},
        "name": {"type": "string", "minLength": 1},
        "partial_response_strategy": {"type": "string", "pattern": "(?i)^(abort|warn)?$"},
        "query_offset": DURATION,
        "rules": {"type": "array", "items": RULE},
    },
}

PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"groups": {"type": "array", "items": GROUP}},
        },
    },
}
