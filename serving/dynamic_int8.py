"""torch.ao's dynamic int8 linears in a form ``torch.export`` can carry.

``torch.ao.quantization.quantize_dynamic`` (engine ``torch-ao``, the fastest
int8-dynamic path on CPU) keeps each layer's weights in a packed fbgemm object
(``LinearPackedParamsBase``, a TorchScript class) that ``torch.export`` cannot
trace. :func:`exportable` returns a copy of a model in which every such layer
is a :class:`DynamicInt8Linear`: the same int8 weights, scales and bias as
plain buffers, and one op, ``gpulab::dynamic_int8_linear``, that packs them
once and calls the same fbgemm kernel (``quantized::linear_dynamic``). The
exported program therefore answers exactly as the quantized model did in the
notebook, as fast.

The op is registered when this module is imported; :mod:`gpulab.serving.export`
imports it, so the model server can load such programs.
"""

import copy
from typing import Optional

import torch
from torch.ao.nn.quantized.dynamic import Linear as TorchAoDynamicLinear
from torch.utils.weak import WeakIdKeyDictionary

OP = "gpulab::dynamic_int8_linear"

# The packed weights of each served layer, made on its first call and kept while its
# weight tensor lives: fbgemm packs (reorders) the whole matrix, too much for every call.
_packed: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _pack(weight, scale, zero_point, bias):
    if scale.numel() == 1:
        q = torch._make_per_tensor_quantized_tensor(
            weight, float(scale.item()), int(zero_point.item())
        )
    else:
        q = torch._make_per_channel_quantized_tensor(weight, scale, zero_point, 0)
    return torch.ops.quantized.linear_prepack(q, bias)


@torch.library.custom_op(OP, mutates_args=())
def dynamic_int8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    bias: Optional[torch.Tensor],  # noqa: UP045 - custom_op reads the annotation at runtime
    reduce_range: bool,
) -> torch.Tensor:
    """``quantized::linear_dynamic`` on int8 weights kept as a plain tensor."""
    held = _packed.get(weight)
    if held is None or held[0] != weight._version:
        held = (weight._version, _pack(weight, scale, zero_point, bias))
        _packed[weight] = held
    return torch.ops.quantized.linear_dynamic(x, held[1], reduce_range).to(x.dtype)


@dynamic_int8_linear.register_fake
def _(x, weight, scale, zero_point, bias, reduce_range):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class DynamicInt8Linear(torch.nn.Module):
    """A torch.ao dynamic int8 linear layer whose weights ``torch.export`` can see."""

    def __init__(self, layer: TorchAoDynamicLinear):
        super().__init__()
        weight = layer.weight()
        if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            scale = torch.tensor([weight.q_scale()], dtype=torch.float64)
            zero_point = torch.tensor([weight.q_zero_point()], dtype=torch.int64)
        elif weight.q_per_channel_axis() == 0:
            scale = weight.q_per_channel_scales().to(torch.float64)
            zero_point = weight.q_per_channel_zero_points().to(torch.int64)
        else:
            raise ValueError(f"weights quantized along axis {weight.q_per_channel_axis()}")
        self.in_features = layer.in_features
        self.out_features = layer.out_features
        self.register_buffer("weight", weight.int_repr())
        self.register_buffer("scale", scale)
        self.register_buffer("zero_point", zero_point)
        self.register_buffer("bias", layer.bias())
        # torch.ao's layers since version 4 quantize activations to 7 bits (reduce_range),
        # which keeps fbgemm's int16 accumulation from overflowing on CPUs without VNNI.
        version = getattr(layer, "version", None)
        self.reduce_range = version is not None and version >= 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dynamic_int8_linear(
            x, self.weight, self.scale, self.zero_point, self.bias, self.reduce_range
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype=qint8"


def unsupported(model: torch.nn.Module) -> str | None:
    """Why a torch.ao-quantized layer of ``model`` cannot be exported; None if all can."""
    rewritten: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{r}.") or not r for r in rewritten):
            continue  # the packed weights of a layer that is rewritten whole
        if isinstance(module, TorchAoDynamicLinear):
            dtype = module._packed_params.dtype
            if dtype != torch.qint8:
                return f"{_layer(name)} is a torch.ao dynamic linear with {dtype} weights"
            rewritten.append(name)
        elif any(isinstance(v, torch.ScriptObject) for v in vars(module).values()):
            # Static layers keep theirs in a child named _packed_params: name the layer.
            parent, _, last = name.rpartition(".")
            layer = parent if last == "_packed_params" else name
            kind = model.get_submodule(layer)._get_name()
            return f"{_layer(layer)} ({kind}) holds packed torch.ao weights"
    return None


def _layer(name: str) -> str:
    return f"layer {name!r}" if name else "the model"


def has_dynamic_int8(model: torch.nn.Module) -> bool:
    return any(isinstance(m, TorchAoDynamicLinear) for m in model.modules())


def exportable(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with each torch.ao dynamic int8 linear a :class:`DynamicInt8Linear`.

    ``model`` itself is left alone. Call :func:`unsupported` first.
    """
    model = copy.deepcopy(model)
    if isinstance(model, TorchAoDynamicLinear):
        return DynamicInt8Linear(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, TorchAoDynamicLinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, DynamicInt8Linear(module))
    return model
