"""JSON schemas of the custom resources gpulab creates, written from their CRD documentation.

kubernetes-validate ships schemas for built-in kinds only. These cover the
fields gpulab sets (and reject any other, so a typo fails): JobSet
``jobset.x-k8s.io/v1alpha2`` (https://jobset.sigs.k8s.io/docs/reference/jobset.v1alpha2/)
and KServe ``serving.kserve.io/v1beta1`` InferenceService
(https://kserve.github.io/website/docs/reference/crd-api). The pod and Job
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
