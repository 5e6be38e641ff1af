"""The backend-neutral description of a training job, and its validation.

A :class:`JobSpec` is everything a backend needs to run a job and nothing about
how: the local backend turns it into torchrun processes, the Kubernetes backend
into an Indexed Job; both render the same per-node command line
(:mod:`.render`). It travels as JSON (``to_json``/``from_json``); the cell's
variables travel inside it as base64 cloudpickle bytes, opaque to everyone but
the ranks.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict, dataclass, field, fields

AMP_CHOICES = ("", "bf16", "fp16")
COMM_HOOK_CHOICES = ("", "powersgd", "fp16", "bf16")
BACKENDS = ("local", "kubernetes")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the backend owns; a user setting them would break the launch.
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "GPULAB_")
RESERVED_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "CUDA_VISIBLE_DEVICES"}
MAX_NODES = 64
MAX_NPROC = 64


class SpecError(ValueError):
    """A job spec that cannot run; the message says which field and what is allowed."""


@dataclass
class JobSpec:
    code: str
    name: str = "train"
    nodes: int = 1
    nproc_per_node: int = 1
    gpu_milli: int = 0  # per rank
    image: str = ""  # the container image (Kubernetes); the local backend ignores it
    env: dict = field(default_factory=dict)
    vars_b64: str = ""  # cloudpickle of {name: value}, base64
    max_restarts: int = 0
    checkpoint_every: int = 0  # steps; 0 = only at the end of resume_range
    amp: str = ""
    comm_hook: str = ""
    out: str = ""  # variable to send back to the notebook
    timeout: float = 0  # seconds of running before the job is stopped; 0 = none
    priority: int = 0
    backend: str = "local"
    # Set by the service:
    id: str = ""
    user: str = ""
    checkpoint_dir: str = ""  # where ranks read/write checkpoints (a shared volume)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def rank_owners(self) -> list[str]:
        """Ledger owners, one per rank: ``<job id>/<rank>``."""
        return [f"{self.id}/{r}" for r in range(self.world_size)]

    @property
    def vars_bytes(self) -> bytes:
        return base64.b64decode(self.vars_b64) if self.vars_b64 else b""

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "JobSpec":
        if not isinstance(data, dict):
            raise SpecError("a job spec must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SpecError(f"unknown field(s): {', '.join(sorted(unknown))}")
        if "code" not in data:
            raise SpecError("'code' is required: the cell's source")
        spec = cls(**data)
        spec.validate()
        return spec

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
        return cls.from_dict(json.loads(text))

    def validate(self) -> None:
        def integer(name, lo, hi):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise SpecError(f"'{name}' must be an integer from {lo} to {hi}, got {v!r}")

        if not isinstance(self.code, str) or not self.code.strip():
            raise SpecError("'code' must be the cell's source, a non-empty string")
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(f"'name' must be 1-63 letters, digits, '.', '_' or '-', "
                            f"got {self.name!r}")
        integer("nodes", 1, MAX_NODES)
        integer("nproc_per_node", 1, MAX_NPROC)
        integer("gpu_milli", 0, 8000)
        integer("max_restarts", 0, 100)
        integer("checkpoint_every", 0, 10**9)
        integer("priority", -100, 100)
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or self.timeout < 0:
            raise SpecError(f"'timeout' must be seconds >= 0, got {self.timeout!r}")
        if self.amp not in AMP_CHOICES:
            raise SpecError(f"'amp' must be bf16 or fp16, got {self.amp!r}")
        if self.comm_hook not in COMM_HOOK_CHOICES:
            raise SpecError(f"'comm_hook' must be powersgd, fp16 or bf16, got {self.comm_hook!r}")
        if self.backend not in BACKENDS:
            raise SpecError(f"'backend' must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.out and not _IDENT.match(self.out):
            raise SpecError(f"'out' must be a Python variable name, got {self.out!r}")
        if not isinstance(self.env, dict):
            raise SpecError("'env' must be an object of NAME: value strings")
        for k, v in self.env.items():
            if not _ENV_KEY.match(k) or not isinstance(v, str):
                raise SpecError(f"env {k!r}: names are letters, digits and '_', values strings")
            if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIXES):
                raise SpecError(f"env {k!r} is set by gpulab for every rank; pick another name")
        if self.vars_b64:
            try:
                base64.b64decode(self.vars_b64, validate=True)
            except ValueError:
                raise SpecError("'vars_b64' must be base64 (of cloudpickle bytes)") from None
