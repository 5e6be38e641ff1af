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
import math
import re
from dataclasses import asdict, dataclass, field, fields

from gpulab.scheduler.slices import noun

AMP_CHOICES = ("", "bf16", "fp16")
COMM_HOOK_CHOICES = ("", "powersgd", "fp16", "bf16")
#: Quantization-aware training schemes (gpulab.training.qat), "" for none.
QAT_CHOICES = ("", "int8-int4")
_WHERE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the backend owns (the slice, the rendezvous); a user setting them would
# break the launch or step outside the job's slice.
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "GPULAB_", "MASTER_", "CUDA_MPS_", "NVIDIA_")
RESERVED_ENV = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "HOME",
}
# Variables that decide what code a rank loads: never from a request.
LOADER_ENV_PREFIXES = ("LD_", "PYTHON")
LOADER_ENV = {"PATH"}
MAX_NODES = 64
MAX_NPROC = 64
#: A cell's source; a larger one is data, which belongs in a dataset.
MAX_CODE_BYTES = 1 << 20
MAX_ENV_VARS = 256
MAX_ENV_VALUE = 32 << 10
#: 30 days; a job meant to run longer needs no timeout (0).
MAX_TIMEOUT_S = 30 * 86400


class SpecError(ValueError):
    """A job spec that cannot run; the message says which field and what is allowed."""


class SpecTooLarge(SpecError):
    """A field over its size limit (HTTP 413)."""


@dataclass
class JobSpec:
    code: str
    name: str = "train"
    nodes: int = 1  # an elastic job's size now (the service sets it at each launch)
    # Elastic (``--nodes MIN:MAX``): starts once ``min_nodes`` fit, grows to ``max_nodes``
    # as slices free, shrinks toward ``min_nodes`` instead of stopping. 0 and 0: fixed.
    min_nodes: int = 0
    max_nodes: int = 0
    nproc_per_node: int = 1
    gpu_milli: int = 0  # per rank
    image: str = ""  # the container image (Kubernetes); the local backend ignores it
    # One of the site's environments (c.SiteEnvironments) the ranks run in, as the
    # server the job came from does; "": the owner's own (gpulab's, with their installs).
    environment: str = ""
    env: dict = field(default_factory=dict)
    vars_b64: str = ""  # cloudpickle of {name: value}, base64
    max_restarts: int = 0
    checkpoint_every: int = 0  # steps; 0 = only at the end of resume_range
    amp: str = ""
    comm_hook: str = ""
    fsdp: bool = False  # ctx.wrap(model) shards with FSDP2 (--fsdp)
    qat: str = ""  # ctx.wrap(model) trains quantization-aware for this scheme (--qat)
    out: str = ""  # variable to send back to the notebook
    timeout: float = 0  # seconds of running before the job is stopped; 0 = none
    priority: int = 0  # within its priority class: admins raise, users lower
    priority_class: str = "batch"  # a job class (scheduler/priority.py); the service checks access
    preemptible: bool = True  # False: never chosen to make room (--no-preempt)
    # Where it runs: a pool of the site, "auto" (the first with room), or a backend's
    # kind (its pool); "" for both: the site's default (the service decides).
    backend: str = ""
    pool: str = ""
    # Set by the service:
    id: str = ""
    user: str = ""
    checkpoint_dir: str = ""  # where ranks read/write checkpoints (a shared volume)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def elastic(self) -> bool:
        return bool(self.max_nodes) and self.min_nodes < self.max_nodes

    @property
    def least_nodes(self) -> int:
        """The nodes it needs to run: MIN for an elastic job, all of them otherwise."""
        return self.min_nodes if self.elastic else self.nodes

    @property
    def most_nodes(self) -> int:
        return self.max_nodes if self.elastic else self.nodes

    def rank_owners(self) -> list[str]:
        """Ledger owners, one per rank it may hold: ``<job id>/<rank>`` (an elastic
        job's up to MAX nodes, whatever its size now)."""
        return [f"{self.id}/{r}" for r in range(self.most_nodes * self.nproc_per_node)]

    @property
    def vars_bytes(self) -> bytes:
        return base64.b64decode(self.vars_b64) if self.vars_b64 else b""

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> JobSpec:
        if not isinstance(data, dict):
            raise SpecError("a job spec must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SpecError(f"unknown {noun(len(unknown), 'field')}: {', '.join(sorted(unknown))}")
        if "code" not in data:
            raise SpecError("'code' is required: the cell's source")
        spec = cls(**data)
        spec.validate()
        return spec

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_dict(json.loads(text))

    def validate(self) -> None:
        def integer(name, lo, hi):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise SpecError(f"'{name}' must be an integer from {lo} to {hi}, got {v!r}")

        if not isinstance(self.code, str) or not self.code.strip():
            raise SpecError("'code' must be the cell's source, a non-empty string")
        try:
            code_bytes = len(self.code.encode("utf-8"))
        except UnicodeEncodeError:
            raise SpecError(
                "'code' holds characters that are not valid Unicode (a lone "
                "surrogate); send the cell's source as text"
            ) from None
        if code_bytes > MAX_CODE_BYTES:
            raise SpecTooLarge(
                f"'code' is over {MAX_CODE_BYTES >> 20} MiB; keep data out of "
                f"the cell (read it from a file or a dataset)"
            )
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise SpecError(
                f"'name' must be 1-63 letters, digits, '.', '_' or '-', got {self.name!r}"
            )
        integer("nodes", 1, MAX_NODES)
        integer("min_nodes", 0, MAX_NODES)
        integer("max_nodes", 0, MAX_NODES)
        if self.min_nodes or self.max_nodes:
            if not 1 <= self.min_nodes <= self.max_nodes:
                raise SpecError(
                    f"--nodes MIN:MAX needs 1 <= MIN <= MAX, got "
                    f"{self.min_nodes}:{self.max_nodes} (e.g. --nodes 1:4)"
                )
            if not self.min_nodes <= self.nodes <= self.max_nodes:
                # The size it starts at is the service's; a client's is the range's top.
                self.nodes = self.max_nodes
        integer("nproc_per_node", 1, MAX_NPROC)
        integer("gpu_milli", 0, 8000)
        integer("max_restarts", 0, 100)
        integer("checkpoint_every", 0, 10**9)
        integer("priority", -100, 100)
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not math.isfinite(self.timeout)
            or not 0 <= self.timeout <= MAX_TIMEOUT_S
        ):
            raise SpecError(
                f"'timeout' must be seconds >= 0 (0 = none), a finite number up "
                f"to {MAX_TIMEOUT_S}, got {self.timeout!r}"
            )
        if not isinstance(self.priority_class, str) or not _NAME.match(self.priority_class):
            raise SpecError(
                f"'priority_class' must be a class name such as batch, got {self.priority_class!r}"
            )
        if not isinstance(self.preemptible, bool):
            raise SpecError(f"'preemptible' must be true or false, got {self.preemptible!r}")
        if not isinstance(self.image, str) or len(self.image) > 1024:
            raise SpecError("'image' must be a container image name (a string)")
        if not isinstance(self.environment, str) or (
            self.environment and not _NAME.match(self.environment)
        ):
            raise SpecError(
                f"'environment' must be the name of one of the site's environments, "
                f"got {self.environment!r}"
            )
        if self.amp not in AMP_CHOICES:
            raise SpecError(f"'amp' must be bf16 or fp16, got {self.amp!r}")
        if self.qat not in QAT_CHOICES:
            raise SpecError(f"'qat' must be int8-int4 or left out, got {self.qat!r}")
        if not isinstance(self.fsdp, bool):
            raise SpecError(f"'fsdp' must be true or false, got {self.fsdp!r}")
        if self.comm_hook not in COMM_HOOK_CHOICES:
            raise SpecError(f"'comm_hook' must be powersgd, fp16 or bf16, got {self.comm_hook!r}")
        for key in ("backend", "pool"):
            value = getattr(self, key)
            if not isinstance(value, str) or (value and not _WHERE.match(value)):
                raise SpecError(
                    f"'{key}' must be a name like {'slurm' if key == 'backend' else 'box'} "
                    f"or left out (the site's default), got {value!r}"
                )
        if not isinstance(self.out, str) or (self.out and not _IDENT.match(self.out)):
            raise SpecError(f"'out' must be a Python variable name, got {self.out!r}")
        if not isinstance(self.env, dict):
            raise SpecError("'env' must be an object of NAME: value strings")
        if len(self.env) > MAX_ENV_VARS:
            raise SpecError(f"'env' has {len(self.env)} variables; at most {MAX_ENV_VARS}")
        for k, v in self.env.items():
            if not isinstance(k, str) or not _ENV_KEY.match(k) or not isinstance(v, str):
                raise SpecError(f"env {k!r}: names are letters, digits and '_', values strings")
            if "\0" in v or len(v) > MAX_ENV_VALUE:
                raise SpecError(
                    f"env {k!r}: a value is text of at most {MAX_ENV_VALUE >> 10} "
                    f"KiB without NUL bytes"
                )
            if k in LOADER_ENV or k.startswith(LOADER_ENV_PREFIXES):
                raise SpecError(
                    f"env {k!r} is refused: LD_*, PYTHON* and PATH decide which "
                    f"code every rank loads and stay as gpulab sets them; install "
                    f"what the job needs into its environment instead"
                )
            if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIXES):
                raise SpecError(
                    f"env {k!r} is set by gpulab for every rank (the slice and the "
                    f"rendezvous); pick another name"
                )
        if not isinstance(self.vars_b64, str):
            raise SpecError("'vars_b64' must be base64 (of cloudpickle bytes)")
        if self.vars_b64:
            try:
                base64.b64decode(self.vars_b64, validate=True)
            except ValueError:
                raise SpecError("'vars_b64' must be base64 (of cloudpickle bytes)") from None

    @property
    def vars_size(self) -> int:
        """Bytes ``vars_b64`` decodes to, without decoding it."""
        n = len(self.vars_b64)
        return n * 3 // 4 - self.vars_b64[-2:].count("=") if n else 0
