"""``ctx.wrap(model, shard=True)``: FSDP2 (``fully_shard``) per transformer block, then the root.

As torchtitan's ``parallelize`` does: each block of the model's largest
``ModuleList`` (``model.model.layers`` in a Hugging Face Llama, ``transformer.h``
in GPT-2) becomes one FSDP unit, so only one block's full parameters exist at a
time; the root holds what is left (embeddings, the head). Each rank keeps
1/world of the parameters, gradients and optimizer state.

Mixed precision where the device has it: bf16 parameters for compute and fp32
gradient reduction on a GPU with bf16; on CPU the parameters stay fp32 (said
once in rank 0's log). Activation checkpointing per block (``checkpointing=True``)
recomputes a block's activations in the backward pass instead of holding them.

Before sharding, a parameter-less copy of the model (on the meta device) is kept:
``--out`` loads the gathered full state dict into it (:mod:`.out`), which gives
back the class the user built, never a module holding a process group.
"""

from __future__ import annotations

import copy

#: The rank's model -> its meta-device skeleton (what ``--out`` fills).
_skeletons: dict[int, object] = {}


def transformer_blocks(model) -> list:
    """The blocks to shard one by one: the children of the ``ModuleList`` holding the
    most parameters (none: the model is sharded as one unit)."""
    import torch

    best, best_size = None, 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = module, size
    return list(best) if best is not None else []


def embeddings(model) -> list:
    """The input embedding and the output head, each its own unit (as torchtitan
    shards ``tok_embeddings`` and ``output``): with a large vocabulary they are the
    biggest layers, and left in the root they would be gathered whole for the whole
    step. Not when they share one weight (tied): they stay in the root together."""
    found = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if module is not None and next(module.parameters(), None) is not None:
            found.append(module)
    if len(found) == 2:
        shared = {id(p) for p in found[0].parameters()} & {id(p) for p in found[1].parameters()}
        if shared:
            return []
    return found


def meta_skeleton(model):
    """A copy of ``model`` whose parameters and buffers are on the meta device (no
    memory), ties kept: the same tensor object maps to the same copy."""
    import torch

    memo = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in memo:
            continue
        empty = torch.empty_like(tensor, device="meta")
        if isinstance(tensor, torch.nn.Parameter):
            empty = torch.nn.Parameter(empty, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = empty
    return copy.deepcopy(model, memo)


def skeleton_of(model):
    return _skeletons.get(id(model))


def mixed_precision(device) -> tuple[object | None, str]:
    """FSDP2's policy for ``device`` and a line saying what it is."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return policy, "bf16 parameters for compute, fp32 gradient reduction"
    return None, f"parameters stay fp32 on {device.type} (bf16 mixed precision needs a GPU)"


def shard(model, ctx, checkpointing: bool = False):
    """Apply FSDP2 to ``model`` in place (per block, the embeddings, then the root)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    skeleton = meta_skeleton(model)
    # Not model.to(device) first: fully_shard moves each unit to the mesh's device
    # as it shards it, so a GPU never holds more than one unit whole.
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy, precision = mixed_precision(ctx.device)
    kwargs = {"mesh": mesh}
    if policy is not None:
        kwargs["mp_policy"] = policy
    blocks = transformer_blocks(model)
    for block in blocks:
        if checkpointing:
            from torch.distributed._composable import checkpoint

            checkpoint(block)
        fully_shard(block, **kwargs)
    ends = embeddings(model)
    for module in ends:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    _skeletons[id(model)] = skeleton
    if ctx.rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"gpulab: FSDP2 over {ctx.world_size} ranks, {len(blocks)} blocks"
            + (" + embeddings and head" if ends else "")
            + " + root, "
            f"{params / 1e6:.1f} M parameters (1/{ctx.world_size} on each rank); {precision}"
            + ("; activation checkpointing per block" if checkpointing else ""),
            flush=True,
        )
    return model
