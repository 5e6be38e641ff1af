"""``setup()``: the process group, this rank's device, and how to wrap a model.

On a GPU each rank sees only its own card (``CUDA_VISIBLE_DEVICES`` set to the
UUID the scheduler gave it, before CUDA starts) and is held to its share with
``torch.cuda.set_per_process_memory_fraction``. Without a usable GPU the group
runs gloo on CPU, which is also what simulated GPUs get.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from . import env

AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
COMM_HOOKS = ("powersgd", "fp16", "bf16")


class SetupError(RuntimeError):
    """The job asked for something this rank cannot do (says what instead)."""


def _pin_gpu() -> tuple[str | None, bool]:
    """Make this rank's GPU the only one it sees; return its UUID (or None) and
    whether another rank of this node shares that card."""
    gpus = [g for g in env.get(env.NODE_GPUS).split(",") if g]
    if not gpus:
        return None, False
    mine = gpus[env.local_rank() % len(gpus)]
    # Must happen before CUDA initialises; importing torch does not initialise it.
    os.environ["CUDA_VISIBLE_DEVICES"] = mine
    return mine, gpus.count(mine) > 1


@dataclass
class Context:
    rank: int
    local_rank: int
    world_size: int
    device: object
    backend: str
    amp: str = ""
    comm_hook: str = ""
    restart: int = 0
    _hook_state: list = field(default_factory=list, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model, shard: bool | None = None, checkpointing: bool = False, qat: str = ""):
        """Move ``model`` to this rank's device and wrap it in DDP (with the comm hook).

        ``shard=True`` (or the job's ``--fsdp``) shards it instead: FSDP2 per
        transformer block, for a model whose training state does not fit one rank
        (:mod:`.shard`); ``checkpointing=True`` adds activation checkpointing per block.
        ``qat="int8-int4"`` trains it quantization-aware (:mod:`.qat`): ``%quantize``
        then converts it with that scheme.
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        if shard is None:
            shard = env.get(env.FSDP) == "1"
        qat = qat or env.get(env.QAT)
        if qat:
            if shard:
                raise SetupError("qat= and sharding (FSDP) do not go together yet; use DDP")
            from .qat import QATError, prepare

            try:
                prepare(model, qat)
            except QATError as e:
                raise SetupError(str(e)) from None
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return model.to(self.device)
        if shard:
            from .shard import shard as fully_shard

            return fully_shard(model, self, checkpointing=checkpointing)
        model = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids)
        self._register_hook(ddp)
        return ddp

    def _register_hook(self, ddp) -> None:
        if not self.comm_hook:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if self.comm_hook == "bf16" and self.backend != "nccl":
            raise SetupError("the bf16 comm hook needs NCCL (GPUs); use fp16 or powersgd on gloo")
        if self.comm_hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None,
                matrix_approximation_rank=1,
                start_powerSGD_iter=2,
                use_error_feedback=True,
            )
            self._hook_state.append(state)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        elif self.comm_hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.comm_hook == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        else:
            raise SetupError(f"unknown comm hook {self.comm_hook!r}; use one of {COMM_HOOKS}")

    def autocast(self):
        """``with ctx.autocast():`` runs the forward pass in the job's ``--amp`` dtype."""
        import torch

        if not self.amp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, AMP_DTYPES[self.amp]))

    def grad_scaler(self):
        """A GradScaler for fp16 on GPU; a disabled one otherwise (always safe to use)."""
        import torch

        return torch.amp.GradScaler(
            self.device.type, enabled=self.amp == "fp16" and self.device.type == "cuda"
        )

    # -- elastic jobs: the same global batch at any world size (see .batches) --
    def micro_batches(
        self, step: int, dataset_size: int, *, global_batch: int, micro_batch: int, seed: int = 0
    ):
        """This rank's micro-batches of ``step``: the same global batch (samples, order
        and weights) whatever the world size; see :mod:`gpulab.training.batches`."""
        from .batches import micro_batches

        return micro_batches(
            step,
            dataset_size,
            global_batch=global_batch,
            micro_batch=micro_batch,
            rank=self.rank,
            world_size=self.world_size,
            seed=seed,
        )

    def accumulation(self, global_batch: int, micro_batch: int) -> int:
        """Micro-batches per step at this world size (gradient accumulation)."""
        from .batches import accumulation

        return accumulation(global_batch, micro_batch, self.world_size)

    def accumulating(self, model, micro_batch):
        """``with ctx.accumulating(model, mb):`` around a micro-batch's backward: DDP
        exchanges gradients only after the step's last one."""
        if micro_batch.last or not hasattr(model, "no_sync"):
            return contextlib.nullcontext()
        return model.no_sync()

    def barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()


_context: Context | None = None


def setup(backend: str | None = None) -> Context:
    """Join the job's process group (once) and return this rank's :class:`Context`."""
    global _context
    if _context is not None:
        return _context
    gpu, shared = _pin_gpu()
    import torch
    import torch.distributed as dist

    amp = env.get(env.AMP)
    if amp and amp not in AMP_DTYPES:
        raise SetupError(f"unknown --amp {amp!r}; use bf16 or fp16")
    use_cuda = gpu is not None and torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        milli = int(env.get(env.GPU_MILLI, "1000") or 1000)
        if 0 < milli < 1000:
            torch.cuda.set_per_process_memory_fraction(milli / 1000, device)
    else:
        device = torch.device("cpu")
    # NCCL refuses two ranks on one card ("Duplicate GPU detected"); fractional
    # slices can put them there, and gloo moves CUDA tensors through the host.
    backend = backend or ("nccl" if use_cuda and not shared else "gloo")
    world = env.world_size()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if use_cuda else None)
    _context = Context(
        rank=env.rank(),
        local_rank=env.local_rank(),
        world_size=world,
        device=device,
        backend=backend,
        amp=amp,
        comm_hook=env.get(env.COMM_HOOK),
        restart=env.restart_count(),
    )
    return _context


def current() -> Context | None:
    return _context
