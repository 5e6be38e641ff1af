"""Which layers of a model a weight quantizer can take, and which it must leave.

Quantizers (``torch.ao`` ``quantize_dynamic``, torchao ``quantize_``) take
``torch.nn.Linear`` only. Language models hold their matrices in other shapes too:

- GPT-2-style ``Conv1D`` (``transformers.pytorch_utils``): a linear layer whose
  weight is stored transposed, ``(in, out)``. :func:`convert_conv1d` replaces each
  with the ``nn.Linear`` that computes the same, so it is quantized like any other.
- A ``Linear`` whose weight is *tied* to another parameter (``lm_head`` sharing the
  embedding's matrix): quantizing it stores a second, quantized copy beside the
  float one the embedding keeps, so the model grows. It stays in float.
- Any other module holding a matrix (a 2-D ``weight``) that is neither of those,
  nor an embedding or a norm, is named in the report as not quantized.

:func:`plan` says all of this for a model, by layer name, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: Modules with a 2-D weight that no weight quantizer is meant to take.
NOT_LINEAR = (torch.nn.Embedding, torch.nn.EmbeddingBag, torch.nn.LayerNorm)


def is_conv1d(module: torch.nn.Module) -> bool:
    """A GPT-2-style ``Conv1D``: ``y = x @ weight + bias``, weight ``(nx, nf)``."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and getattr(module, "nf", None) == weight.shape[1]
    )


def conv1d_as_linear(module: torch.nn.Module) -> torch.nn.Linear:
    """The ``nn.Linear`` that computes what ``module`` (a ``Conv1D``) does."""
    nx, nf = module.weight.shape
    bias = getattr(module, "bias", None)
    linear = torch.nn.Linear(
        nx, nf, bias=bias is not None, device=module.weight.device, dtype=module.weight.dtype
    )
    with torch.no_grad():
        linear.weight.copy_(module.weight.t())
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


def convert_conv1d(model: torch.nn.Module) -> list[str]:
    """Replace every ``Conv1D`` in ``model`` (in place) by its ``nn.Linear``; their names."""
    names = [name for name, m in model.named_modules() if name and is_conv1d(m)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, conv1d_as_linear(getattr(parent, child)))
    return names


@dataclass
class Plan:
    """What will be quantized (``linear``, by name) and what stays in float, and why."""

    linear: list[str] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)  # linear -> the parameter it shares
    other: dict[str, str] = field(default_factory=dict)  # name -> class, matrices left alone
    params_total: int = 0
    params_quantized: int = 0

    @property
    def share(self) -> float:
        """The share of the model's parameters that will be quantized."""
        return self.params_quantized / self.params_total if self.params_total else 0.0


def plan(model: torch.nn.Module) -> Plan:
    """Which layers of ``model`` (after :func:`convert_conv1d`) a quantizer takes."""
    result = Plan()
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in names:
            result.params_total += p.numel()
        names.setdefault(id(p), []).append(name)
    for name, module in model.named_modules():
        if not name:
            continue
        if isinstance(module, torch.nn.Linear):
            shared = [n for n in names.get(id(module.weight), []) if n != f"{name}.weight"]
            if shared:
                result.tied[name] = shared[0]
                continue
            result.linear.append(name)
            result.params_quantized += module.weight.numel()
        elif isinstance(module, NOT_LINEAR) or module is model:
            continue
        else:
            weight = module._parameters.get("weight")
            if isinstance(weight, torch.Tensor) and weight.dim() == 2:
                result.other[name] = type(module).__name__
    return result
