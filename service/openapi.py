"""The OpenAPI 3 description of the service's routes."""

from __future__ import annotations

_ERROR = {"description": "Bad input or not allowed; the message says what to do",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _json(ref: str, description: str = "OK", array: bool = False) -> dict:
    schema = {"$ref": f"#/components/schemas/{ref}"}
    if array:
        schema = {"type": "array", "items": schema}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
USER = {"name": "user", "in": "query", "required": False, "schema": {"type": "string"},
        "description": "admins: another user's"}


def openapi_document(prefix: str) -> dict:
    # 400: bad input, bodies that are not UTF-8 JSON objects included; 413: a body (or
    # an upload, or what it unpacks to) over its limit; 409: a conflict, e.g. releasing
    # the slice of a server, job or deployment that still runs.
    errors = {"400": _ERROR, "401": _ERROR, "403": _ERROR, "404": _ERROR, "409": _ERROR,
              "413": _ERROR}
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpulab service", "version": "1",
                 "description": "GPU inventory, slice allocations and quotas behind JupyterHub. "
                                "Authenticate with `Authorization: token <JupyterHub API token>` "
                                "or the hub's OAuth cookie."},
        "servers": [{"url": prefix.rstrip("/")}],
        "components": {
            "securitySchemes": {"token": {"type": "apiKey", "in": "header",
                                          "name": "Authorization"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"}}},
                "Gpu": {"type": "object", "properties": {
                    "uuid": {"type": "string"}, "index": {"type": "integer"},
                    "model": {"type": "string"}, "memory_mib": {"type": "integer"},
                    "allocated_milli": {"type": "integer"}, "simulated": {"type": "boolean"},
                    "mig_parent": {"type": "string", "nullable": True}}},
                "Inventory": {"type": "object", "properties": {
                    "nodes": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"},
                        "gpus": {"type": "array", "items": {"$ref": "#/components/schemas/Gpu"}}}}},
                    "reason": {"type": "string", "nullable": True,
                               "description": "why there are no GPUs, when there are none"}}},
                "Allocation": {"type": "object", "properties": {
                    "id": {"type": "string"}, "user": {"type": "string"},
                    "owner_kind": {"type": "string", "enum": ["server", "job", "deployment"]},
                    "owner": {"type": "string"}, "node": {"type": "string"},
                    "gpu_uuid": {"type": "string"}, "gpu_index": {"type": "integer"},
                    "milli": {"type": "integer", "description": "share of this GPU, 1-1000"},
                    "memory_mib": {"type": "integer"},
                    "created": {"type": "string", "format": "date-time"}}},
                "AllocationRequest": {"type": "object",
                                      "required": ["user", "owner_kind", "owner", "gpu_milli"],
                                      "properties": {
                    "user": {"type": "string"},
                    "owner_kind": {"type": "string", "enum": ["server", "job", "deployment"]},
                    "owner": {"type": "string"},
                    "gpu_milli": {"type": "integer", "description": "0, 1-999, or n*1000"}}},
                "Released": {"type": "object", "properties": {"released": {
                    "type": "array", "items": {"$ref": "#/components/schemas/Allocation"}}}},
                "JobSpec": {"type": "object", "required": ["code"], "properties": {
                    "code": {"type": "string", "description": "the cell's source (at most "
                                                              "1 MiB)"},
                    "name": {"type": "string", "default": "train"},
                    "nodes": {"type": "integer", "default": 1, "minimum": 1,
                              "description": "nodes x nproc_per_node at most "
                                             "c.GpuLabService.max_job_ranks (default 64)"},
                    "nproc_per_node": {"type": "integer", "default": 1, "minimum": 1},
                    "gpu_milli": {"type": "integer", "default": 0,
                                  "description": "slice per rank (one of the offered sizes)"},
                    "backend": {"type": "string", "enum": ["local", "kubernetes"]},
                    "image": {"type": "string"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "not LD_*, PYTHON*, PATH, nor what gpulab sets "
                                           "(RANK, MASTER_*, CUDA_VISIBLE_DEVICES, "
                                           "GPULAB_*...)"},
                    "vars_b64": {"type": "string",
                                 "description": "base64 cloudpickle of {name: value}; at most "
                                                "c.GpuLabService.max_job_vars_mib"},
                    "max_restarts": {"type": "integer", "default": 0},
                    "checkpoint_every": {"type": "integer", "default": 0},
                    "amp": {"type": "string", "enum": ["", "bf16", "fp16"]},
                    "comm_hook": {"type": "string", "enum": ["", "powersgd", "fp16", "bf16"]},
                    "out": {"type": "string", "description": "variable rank 0 sends back"},
                    "timeout": {"type": "number", "minimum": 0, "maximum": 2592000,
                                "description": "seconds running; 0 = none; finite"},
                    "priority": {"type": "integer", "description": "higher first; users <= 0"}}},
                "Job": {"type": "object", "properties": {
                    "id": {"type": "string"}, "user": {"type": "string"},
                    "name": {"type": "string"},
                    "state": {"type": "string", "enum": ["queued", "running", "succeeded",
                                                         "failed", "cancelled"]},
                    "position": {"type": "integer", "nullable": True,
                                 "description": "1 = next to start; null unless queued"},
                    "message": {"type": "string", "description": "why it waits / how it ended"},
                    "priority": {"type": "integer"}, "backend": {"type": "string"},
                    "nodes": {"type": "integer"}, "nproc_per_node": {"type": "integer"},
                    "world_size": {"type": "integer"}, "gpu_milli": {"type": "integer"},
                    "restarts": {"type": "integer"}, "has_out": {"type": "boolean"},
                    "error": {"type": "object", "nullable": True, "properties": {
                        "rank": {"type": "integer"}, "type": {"type": "string"},
                        "message": {"type": "string"}, "traceback": {"type": "string"}}},
                    "submitted": {"type": "string", "format": "date-time"},
                    "started": {"type": "string", "format": "date-time", "nullable": True},
                    "finished": {"type": "string", "format": "date-time", "nullable": True}}},
                "JobMetrics": {"type": "object", "properties": {
                    "records": {"type": "array", "items": {"type": "object",
                                "description": "time, rank, step, total_steps + report() values"}},
                    "cursor": {"type": "integer", "description": "pass back as ?cursor="},
                    "state": {"type": "string"}}},
                "DeploymentSettings": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "description": "1-63 of a-z 0-9 . _ -"},
                    "replicas": {"type": "integer", "default": 1, "minimum": 1,
                                 "description": "at most c.GpuLabService."
                                                "max_deployment_replicas (default 4)"},
                    "gpu_milli": {"type": "integer", "default": 0,
                                  "description": "slice per replica (one of the offered sizes)"},
                    "max_batch_size": {"type": "integer",
                                       "description": "default: 32, or the model's export limit"},
                    "max_latency_ms": {"type": "number", "default": 5},
                    "max_queue": {"type": "integer", "default": 256},
                    "stop_with_server": {"type": "boolean",
                                         "description": "stop when the owner's server stops "
                                                        "(default: the site's setting)"},
                    "share_users": {"type": "array", "items": {"type": "string"}},
                    "share_groups": {"type": "array", "items": {"type": "string"}}}},
                "Deployment": {"type": "object", "properties": {
                    "id": {"type": "string"}, "user": {"type": "string"},
                    "name": {"type": "string"},
                    "state": {"type": "string",
                              "enum": ["starting", "running", "degraded", "failed", "stopped"]},
                    "message": {"type": "string"},
                    "path": {"type": "string", "description": "the endpoint, under the hub: "
                             "POST <hub><path>/v2/models/<name>/infer"},
                    "replicas": {"type": "integer"}, "replicas_ready": {"type": "integer"},
                    "restarts": {"type": "integer"}, "gpu_milli": {"type": "integer"},
                    "gpus": {"type": "array", "items": {"type": "string"}},
                    "max_batch_size": {"type": "integer"}, "max_latency_ms": {"type": "number"},
                    "max_queue": {"type": "integer"}, "stop_with_server": {"type": "boolean"},
                    "share_users": {"type": "array", "items": {"type": "string"}},
                    "share_groups": {"type": "array", "items": {"type": "string"}},
                    "model": {"type": "object", "nullable": True,
                              "description": "the model card: name, inputs, outputs"},
                    "requests_total": {"type": "integer"},
                    "requests_per_second": {"type": "number"},
                    "p99_latency_ms": {"type": "number", "nullable": True},
                    "created": {"type": "string", "format": "date-time"}}},
                "LedgerCheck": {"type": "object", "properties": {
                    "checked": {"type": "string", "format": "date-time", "nullable": True},
                    "lost": {"type": "array", "items": {"type": "object", "properties": {
                        "owner_kind": {"type": "string",
                                       "enum": ["server", "job", "deployment"]},
                        "owner": {"type": "string"}, "user": {"type": "string"},
                        "milli": {"type": "integer", "description": "milli-GPU it lacks"},
                        "message": {"type": "string"}}}}}},
                "AllreduceResult": {"type": "object", "required": [
                    "size_bytes", "world_size", "algbw_bytes_per_second",
                    "busbw_bytes_per_second"], "properties": {
                    "size_bytes": {"type": "integer", "minimum": 4},
                    "world_size": {"type": "integer", "minimum": 1},
                    "algbw_bytes_per_second": {"type": "number", "minimum": 0,
                                               "maximum": 1e13},
                    "busbw_bytes_per_second": {"type": "number", "minimum": 0,
                                               "maximum": 1e13,
                                               "description": "algbw * 2(n-1)/n"},
                    "time_s": {"type": "number", "description": "size_bytes / algbw"},
                    "backend": {"type": "string"},
                    "nodes": {"type": "array", "items": {"type": "string"}},
                    "job_id": {"type": "string", "nullable": True}}},
                "Telemetry": {"type": "object", "description":
                              "Recent samples you may see: per node GPUs (utilisation, memory, "
                              "temperature, power; holders), NICs, RDMA ports, the dataset "
                              "cache, the last all-reduce probe; plus jobs and slices"},
                "Availability": {"type": "object", "properties": {
                    "user": {"type": "string"}, "held_milli": {"type": "integer"},
                    "quota_milli": {"type": "integer", "nullable": True},
                    "simulated": {"type": "boolean"},
                    "sizes": {"type": "array", "items": {"type": "object", "properties": {
                        "milli": {"type": "integer"}, "label": {"type": "string"},
                        "count": {"type": "integer"}, "available": {"type": "boolean"},
                        "reason": {"type": "string", "nullable": True}}}}}},
            },
        },
        "security": [{"token": []}],
        "paths": {
            "/api/v1/inventory": {"get": {
                "summary": "GPUs per node and how much of each is allocated",
                "responses": {"200": _json("Inventory"), **errors}}},
            "/api/v1/allocations": {
                "get": {"summary": "Allocations: your own; admins see all",
                        "parameters": [{"name": n, "in": "query", "required": False,
                                        "schema": {"type": "string"}}
                                       for n in ("user", "owner_kind", "owner")],
                        "responses": {"200": _json("Allocation", array=True), **errors}},
                "post": {"summary": "Allocate a slice for an owner (the hub's spawner; admins)",
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"$ref": "#/components/schemas/AllocationRequest"}}}},
                         "responses": {"201": _json("Allocation", "Placed", array=True),
                                       **errors}},
                "delete": {"summary": "Release everything one owner holds (409 for a user "
                                      "whose server, job or deployment still runs)",
                           "parameters": [{"name": n, "in": "query", "required": True,
                                           "schema": {"type": "string"}}
                                          for n in ("owner_kind", "owner")],
                           "responses": {"200": _json("Released"), **errors}}},
            "/api/v1/allocations/{id}": {
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "get": {"summary": "One allocation", "responses": {"200": _json("Allocation"),
                                                                    **errors}},
                "delete": {"summary": "Release an allocation (and its owner's other rows); "
                                      "409 for a user whose owner still runs",
                           "responses": {"200": _json("Released"), **errors}}},
            "/api/v1/ledger": {"get": {
                "summary": "Live servers, jobs and deployments that hold no slice (the "
                           "reconcile loop's finding): your own; admins see all",
                "responses": {"200": _json("LedgerCheck"), **errors}}},
            "/api/v1/availability": {"get": {
                "summary": "How many of each slice size you could get now",
                "parameters": [{"name": "user", "in": "query", "required": False,
                                "schema": {"type": "string"}}],
                "responses": {"200": _json("Availability"), **errors}}},
            "/api/v1/openapi.json": {"get": {"summary": "This document",
                                             "responses": {"200": {"description": "OK"}}}},
            "/api/v1/jobs": {
                "get": {"summary": "Training jobs: your own; admins see all",
                        "parameters": [{"name": n, "in": "query", "required": False,
                                        "schema": {"type": "string"}} for n in ("user", "state")],
                        "responses": {"200": _json("Job", array=True), **errors}},
                "post": {"summary": "Submit a job; it queues until every rank's slice is free",
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"$ref": "#/components/schemas/JobSpec"}}}},
                         "responses": {"201": _json("Job", "Queued"), **errors}}},
            "/api/v1/jobs/{id}": {
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "get": {"summary": "One job", "responses": {"200": _json("Job"), **errors}},
                "delete": {"summary": "Cancel: stop its ranks and release its slices",
                           "responses": {"200": _json("Job"), **errors}}},
            "/api/v1/jobs/{id}/logs": {"get": {
                "summary": "Ranks' logs as text lines prefixed [r0], [r1]..., [node0], [gpulab]",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}},
                               {"name": "follow", "in": "query", "required": False,
                                "schema": {"type": "boolean"},
                                "description": "stream (chunked) until the job ends"},
                               {"name": "rank", "in": "query", "required": False,
                                "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "OK", "content": {"text/plain": {}}},
                              **errors}}},
            "/api/v1/jobs/{id}/metrics": {"get": {
                "summary": "report() records of one rank since a cursor",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}},
                               *[{"name": n, "in": "query", "required": False,
                                  "schema": {"type": "integer"}} for n in ("rank", "cursor")]],
                "responses": {"200": _json("JobMetrics"), **errors}}},
            "/api/v1/jobs/{id}/out": {"get": {
                "summary": "The --out value rank 0 saved (cloudpickle bytes)",
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK",
                                      "content": {"application/octet-stream": {}}},
                              **errors}}},
            "/api/v1/deployments": {
                "get": {"summary": "Model endpoints: your own; admins see all",
                        "parameters": [{"name": "user", "in": "query", "required": False,
                                        "schema": {"type": "string"}}],
                        "responses": {"200": _json("Deployment", array=True), **errors}},
                "post": {"summary": "Deploy: upload an exported model and start its replicas "
                                    "(413 over max_upload_mib, or unpacking to more than "
                                    "max_model_mib; 403 at max_user_deployments)",
                         "requestBody": {"required": True, "content": {"multipart/form-data": {
                             "schema": {"type": "object", "required": ["spec", "model"],
                                        "properties": {
                                 "spec": {"$ref": "#/components/schemas/DeploymentSettings"},
                                 "model": {"type": "string", "format": "binary",
                                           "description": "tar(.gz) of model.pt2 + model.json"}}}}}},
                         "responses": {"201": _json("Deployment", "Starting"), **errors}}},
            "/api/v1/deployments/{name}": {
                "parameters": [NAME, USER],
                "get": {"summary": "One deployment, with requests/s and p99 latency",
                        "responses": {"200": _json("Deployment"), **errors}},
                "patch": {"summary": "Change sharing or stop_with_server",
                          "requestBody": {"required": True, "content": {"application/json": {
                              "schema": {"$ref": "#/components/schemas/DeploymentSettings"}}}},
                          "responses": {"200": _json("Deployment"), **errors}},
                "delete": {"summary": "Stop the replicas and release their slices",
                           "responses": {"200": _json("Deployment"), **errors}}},
            "/api/v1/deployments/{name}/logs": {"get": {
                "summary": "A replica's log (its last 256 KiB)",
                "parameters": [NAME, USER, {"name": "replica", "in": "query", "required": False,
                                            "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "OK", "content": {"text/plain": {}}},
                              **errors}}},
            "/endpoints/{user}/{name}/v2/models/{model}/infer": {"post": {
                "summary": "The endpoint (Open Inference Protocol v2, JSON or binary "
                           "extension), for the owner, admins and those it is shared with; "
                           "also /v2, /v2/health/ready, /v2/models/{name} under the same prefix",
                "parameters": [NAME, {"name": "user", "in": "path", "required": True,
                                      "schema": {"type": "string"}},
                               {"name": "model", "in": "path", "required": True,
                                "schema": {"type": "string"},
                                "description": "the model: the deployment's name"}],
                "responses": {"200": {"description": "OIP v2 inference response"},
                              "429": _ERROR, "503": _ERROR, **errors}}},
            "/api/v1/telemetry": {"get": {
                "summary": "Recent telemetry you may see (same rules as allocations)",
                "parameters": [{"name": "since", "in": "query", "required": False,
                                "schema": {"type": "number"},
                                "description": "unix time; only newer samples"}],
                "responses": {"200": _json("Telemetry"), **errors}}},
            "/api/v1/telemetry/allreduce": {"post": {
                "summary": "Record an all-reduce result (admins and the service; users' "
                           "come from their nettest jobs, so users get 403)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/AllreduceResult"}}}},
                "responses": {"201": _json("AllreduceResult", "Recorded"), **errors}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format)",
                                 "responses": {"200": {"description": "OK",
                                                       "content": {"text/plain": {}}}}}},
        },
    }
