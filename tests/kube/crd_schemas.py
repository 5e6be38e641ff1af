"""JSON schemas of the custom resources gpulab creates, written from their CRD documentation.

kubernetes-validate ships schemas for built-in kinds only. These cover the
fields gpulab sets (and reject any other, so a typo fails): JobSet
``jobset.x-k8s.io/v1alpha2`` (https://jobset.sigs.k8s.io/docs/reference/jobset.v1alpha2/),
KServe ``serving.kserve.io/v1beta1`` InferenceService
(https://kserve.github.io/website/docs/reference/crd-api), and Kueue's
``kueue.x-k8s.io/v1beta1`` LocalQueue, WorkloadPriorityClass and ClusterQueue
(``apis/kueue/v1beta1/*_types.go``: their enums, int32 ranges and the CEL rules
gpulab's objects could break, which :func:`check_kueue` checks). The pod and Job
templates inside them are core Kubernetes and are checked with
kubernetes-validate by the tests, wrapped in a Job or a Pod.
"""

_NAME = {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _NAME, "namespace": _NAME, "labels": _STR_MAP, "annotations": _STR_MAP},
}
_COUNT = {"type": "integer", "minimum": 0}

JOBSET = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
        "kind": {"const": "JobSet"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["replicatedJobs"],
            "additionalProperties": False,
            "properties": {
                "replicatedJobs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "template"],
                        "additionalProperties": False,
                        "properties": {
                            "name": _NAME,
                            "replicas": _COUNT,
                            "dependsOn": {"type": "array"},
                            "template": {
                                "type": "object",
                                "required": ["spec"],
                                "additionalProperties": False,
                                "properties": {
                                    "metadata": {"type": "object"},
                                    "spec": {"type": "object"},
                                },
                            },
                        },
                    },
                },
                "network": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "enableDNSHostnames": {"type": "boolean"},
                        "subdomain": _NAME,
                        "publishNotReadyAddresses": {"type": "boolean"},
                    },
                },
                "successPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["operator"],
                    "properties": {
                        "operator": {"enum": ["All", "Any"]},
                        "targetReplicatedJobs": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "failurePolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "maxRestarts": {"type": "integer", "minimum": 0},
                        "restartStrategy": {"enum": ["Recreate", "BlockingRecreate"]},
                        "rules": {"type": "array"},
                    },
                },
                "startupPolicy": {"type": "object"},
                "suspend": {"type": "boolean"},
                "coordinator": {"type": "object"},
                "managedBy": {"type": "string"},
                "ttlSecondsAfterFinished": _COUNT,
            },
        },
    },
}

#: Fields of the predictor that KServe adds to a pod spec (ComponentExtensionSpec).
KSERVE_COMPONENT_FIELDS = (
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
)

INFERENCE_SERVICE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {
                "predictor": {
                    "type": "object",
                    "required": ["containers"],
                    "properties": {
                        "minReplicas": _COUNT,
                        "maxReplicas": _COUNT,
                        "labels": _STR_MAP,
                        "annotations": _STR_MAP,
                        # A custom predictor: exactly one serving container.
                        "containers": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 1,
                            "items": {"type": "object", "required": ["name", "image"]},
                        },
                    },
                },
                "transformer": {"type": "object"},
                "explainer": {"type": "object"},
            },
        },
    },
}


_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_DNS_SUBDOMAIN = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
_QUANTITY = {"type": ["string", "integer", "number"]}
_KUEUE_METADATA = {**_METADATA, "properties": {**_METADATA["properties"], "name": _DNS_SUBDOMAIN}}


def _kueue(kind: str, **properties) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "kueue.x-k8s.io/v1beta1"},
            "kind": {"const": kind},
            "metadata": _KUEUE_METADATA,
            **properties,
        },
    }


LOCAL_QUEUE = _kueue(
    "LocalQueue",
    spec={
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "clusterQueue": _DNS_SUBDOMAIN,
            "stopPolicy": {"enum": ["None", "Hold", "HoldAndDrain"]},
            "fairSharing": {"type": "object"},
        },
    },
)

WORKLOAD_PRIORITY_CLASS = _kueue(
    "WorkloadPriorityClass",
    value=_INT32,
    description={"type": "string"},
)
WORKLOAD_PRIORITY_CLASS["required"] = [*WORKLOAD_PRIORITY_CLASS["required"], "value"]

_PREEMPTION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "reclaimWithinCohort": {"enum": ["Never", "LowerPriority", "Any"]},
        "borrowWithinCohort": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "policy": {"enum": ["Never", "LowerPriority"]},
                "maxPriorityThreshold": _INT32,
            },
        },
        "withinClusterQueue": {"enum": ["Never", "LowerPriority", "LowerOrNewerEqualPriority"]},
    },
}
_RESOURCE_GROUP = {
    "type": "object",
    "required": ["coveredResources", "flavors"],
    "additionalProperties": False,
    "properties": {
        "coveredResources": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "items": {"type": "string"},
        },
        "flavors": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "items": {
                "type": "object",
                "required": ["name", "resources"],
                "additionalProperties": False,
                "properties": {
                    "name": _DNS_SUBDOMAIN,
                    "resources": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 64,
                        "items": {
                            "type": "object",
                            "required": ["name", "nominalQuota"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "nominalQuota": _QUANTITY,
                                "borrowingLimit": _QUANTITY,
                                "lendingLimit": _QUANTITY,
                            },
                        },
                    },
                },
            },
        },
    },
}
CLUSTER_QUEUE = _kueue(
    "ClusterQueue",
    spec={
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "resourceGroups": {"type": "array", "maxItems": 16, "items": _RESOURCE_GROUP},
            "cohort": _DNS_SUBDOMAIN,
            "queueingStrategy": {"enum": ["StrictFIFO", "BestEffortFIFO"]},
            "namespaceSelector": {"type": "object"},
            "flavorFungibility": {"type": "object"},
            "preemption": _PREEMPTION,
            "admissionChecks": {"type": "array"},
            "admissionChecksStrategy": {"type": "object"},
            "stopPolicy": {"enum": ["None", "Hold", "HoldAndDrain"]},
            "fairSharing": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"weight": _QUANTITY},
            },
            "admissionScope": {"type": "object"},
        },
    },
)

KUEUE_SCHEMAS = {
    "LocalQueue": LOCAL_QUEUE,
    "WorkloadPriorityClass": WORKLOAD_PRIORITY_CLASS,
    "ClusterQueue": CLUSTER_QUEUE,
}


def check_kueue(obj: dict) -> None:
    """Validate a Kueue object against its schema above and the CEL rules of its CRD."""
    import jsonschema

    jsonschema.validate(obj, KUEUE_SCHEMAS[obj["kind"]])
    if obj["kind"] != "ClusterQueue":
        return
    spec = obj.get("spec", {})
    for group in spec.get("resourceGroups", []):
        for flavor in group["flavors"]:
            assert len(flavor["resources"]) == len(group["coveredResources"]), (
                "flavors must have the same number of resources as the coveredResources"
            )
            if not spec.get("cohort"):
                assert not any("borrowingLimit" in r for r in flavor["resources"]), (
                    "borrowingLimit must be nil when cohort is empty"
                )
    preemption = spec.get("preemption", {})
    borrow = preemption.get("borrowWithinCohort", {})
    assert not (
        preemption.get("reclaimWithinCohort", "Never") == "Never"
        and borrow.get("policy", "Never") != "Never"
    ), "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never"
    # Documented, not a CEL rule: borrowWithinCohort works with classic preemption only.
    assert not (spec.get("fairSharing") and borrow.get("policy", "Never") != "Never"), (
        "borrowWithinCohort may only be configured with classical preemption, not fair sharing"
    )
