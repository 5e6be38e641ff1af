"""``--out`` of a model sharded with FSDP2: the whole model, gathered to rank 0.

A sharded module holds DTensors over the job's process group, which cannot be
pickled ("cannot pickle ProcessGroup") and would mean nothing in the notebook.
Every rank takes part in gathering the full state dict (a collective, to rank
0's CPU memory); rank 0 loads it into the parameter-less copy kept when the
model was sharded (:func:`.shard.meta_skeleton`), so the notebook gets back the
class it built, unsharded, in fp32 as trained.
"""

from __future__ import annotations

import os


def is_sharded(value) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    if isinstance(value, FSDPModule):
        return True
    params = getattr(value, "parameters", None)
    return callable(params) and any(isinstance(p, DTensor) for p in params())


def _set(module, dotted: str, tensor, buffer: bool) -> None:
    owner_path, _, name = dotted.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    if buffer:
        owner._buffers[name] = tensor
    else:
        owner._parameters[name] = tensor


def consolidate(model, rank: int):
    """Rank 0: an unsharded copy of the sharded ``model`` on the CPU; others: None.
    Every rank must call it (the gather is a collective)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from .shard import meta_skeleton, skeleton_of

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if rank != 0:
        return None
    skeleton = skeleton_of(model)
    if skeleton is None:  # sharded by the cell's own fully_shard: rebuild from its structure
        skeleton = meta_skeleton(model)
    skeleton.load_state_dict(full, strict=False, assign=True)
    # What a state dict leaves out (non-persistent buffers such as rotary
    # frequencies) is not sharded: take it from this rank's model.
    live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    missing = [("buffer", skeleton.named_buffers()), ("param", skeleton.named_parameters())]
    for kind, named in missing:
        for name, tensor in list(named):
            if not tensor.is_meta:
                continue
            source = live.get(name)
            if source is None or hasattr(source, "full_tensor"):
                raise RuntimeError(f"--out: {name} did not come back from the ranks")
            value = source.detach().to("cpu").clone()
            if kind == "param":
                value = torch.nn.Parameter(value, requires_grad=tensor.requires_grad)
            _set(skeleton, name, value, buffer=kind == "buffer")
    if hasattr(skeleton, "tie_weights"):  # Hugging Face: embeddings shared with the head
        skeleton.tie_weights()
    return skeleton


def save_hf_folder(model, out_dir: str) -> str | None:
    """A Hugging Face model also as ``out/hf`` (config + safetensors), which
    ``%deploy`` and ``from_pretrained`` read; None for other models."""
    if not hasattr(model, "save_pretrained") or not hasattr(model, "config"):
        return None
    folder = os.path.join(out_dir, "hf")
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def gather(value, rank: int):
    """What ``--out`` sends back for ``value``: a sharded model consolidated (every rank
    calls this; rank 0 gets the model, the others None), anything else as it is."""
    if is_sharded(value):
        return consolidate(value, rank)
    return value
