"""Export a model for serving: ``torch.export`` with a dynamic batch dimension.

A model directory holds two files:

* ``model.pt2``  — the exported program (``torch.export.save``);
* ``model.json`` — its card: name, and for every input and output the name, the
  OIP v2 datatype and the shape with ``-1`` for the batch dimension.

The first dimension of every input and every output is the batch; the others
are fixed at export time. The server reads the card to validate requests
before they reach the model.

A ``sentence_transformers.SentenceTransformer`` is the other kind of model:
:mod:`gpulab.serving.embedding` writes its directory and a card of kind
``sentence-embedding`` (text in, embeddings out); :func:`load_model` dispatches
on the card's ``kind``.

Models quantized by torch.ao's ``quantize_dynamic`` (``%quantize --scheme
int8-dynamic`` on CPU) are exported with their int8 layers rewritten by
:mod:`gpulab.serving.dynamic_int8`, whose op this module registers for loading.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch

from . import dynamic_int8

PROGRAM_FILE = "model.pt2"
CARD_FILE = "model.json"
PLATFORM = "pytorch_torch_export"
#: The card's ``kind`` of a torch.export program (the default of cards written before kinds).
KIND = "torch-export"

# OIP v2 datatype names (the Triton/KServe spelling) of the torch dtypes we serve.
TORCH_TO_OIP = {
    torch.bool: "BOOL",
    torch.uint8: "UINT8",
    torch.int8: "INT8",
    torch.int16: "INT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float16: "FP16",
    torch.float32: "FP32",
    torch.float64: "FP64",
}


class ExportError(ValueError):
    """The model cannot be exported for serving; the message says why and what to do."""


@dataclass
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # -1 marks the batch dimension


@dataclass
class ModelCard:
    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    platform: str = PLATFORM
    version: str = "1"
    # "tensor": forward returns one tensor; "sequence": a tuple/list; "dict": a mapping.
    output_structure: str = "tensor"
    requires: list[str] = field(default_factory=list)  # packages needed to load the program
    kind: str = KIND  # or "sentence-embedding" (gpulab.serving.embedding)
    normalized: bool | None = None  # embeddings only: every row has unit length

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> ModelCard:
        raw = json.loads(text)
        raw["inputs"] = [TensorSpec(**t) for t in raw["inputs"]]
        raw["outputs"] = [TensorSpec(**t) for t in raw["outputs"]]
        return cls(**raw)


def _as_tuple(example) -> tuple[torch.Tensor, ...]:
    example = tuple(example) if isinstance(example, (tuple, list)) else (example,)
    if not example or not all(isinstance(t, torch.Tensor) for t in example):
        raise ExportError(
            "example must be a tensor or a tuple of tensors "
            "(one per positional argument of forward)"
        )
    if any(t.dim() == 0 for t in example):
        raise ExportError(
            "every example input needs a batch dimension first "
            "(shape [batch, ...]); got a 0-d tensor"
        )
    batch = {t.shape[0] for t in example}
    if len(batch) != 1:
        raise ExportError(f"example inputs disagree on the batch size (dim 0): {sorted(batch)}")
    return example


def _datatype(t: torch.Tensor, what: str) -> str:
    try:
        return TORCH_TO_OIP[t.dtype]
    except KeyError:
        raise ExportError(
            f"{what} has dtype {t.dtype}, which the server cannot carry; "
            f"use one of {sorted(str(d) for d in TORCH_TO_OIP)}"
        ) from None


def _flatten_outputs(out, output_names):
    """Name the outputs: a tensor is ``output``, a tuple ``output_0..``, a dict its keys."""
    if isinstance(out, torch.Tensor):
        names, tensors, structure = ["output"], [out], "tensor"
    elif isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        names = [f"output_{i}" for i in range(len(out))]
        tensors, structure = list(out), "sequence"
    elif isinstance(out, dict) and all(isinstance(t, torch.Tensor) for t in out.values()):
        names, tensors, structure = [str(k) for k in out], list(out.values()), "dict"
    else:
        raise ExportError(
            "forward must return a tensor, a tuple of tensors or a dict of "
            f"tensors to be served; it returned {type(out).__name__}"
        )
    if output_names is not None:
        if structure == "dict":
            raise ExportError("output_names cannot rename a dict's keys; rename them in forward")
        if len(output_names) != len(tensors):
            raise ExportError(f"{len(output_names)} output_names for {len(tensors)} outputs")
        names = list(output_names)
    return names, tensors, structure


def _input_names(model, n: int, input_names) -> list[str]:
    if input_names is not None:
        if len(input_names) != n:
            raise ExportError(f"{len(input_names)} input_names for {n} example inputs")
        return list(input_names)
    import inspect

    try:
        params = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return params[:n] if len(params) >= n else [f"input_{i}" for i in range(n)]


def export_model(
    model: torch.nn.Module,
    example,
    model_dir: str,
    *,
    name: str | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    max_batch_size: int = 4096,
) -> ModelCard:
    """Export ``model`` traced on ``example`` into ``model_dir``; return its card.

    ``example`` is a tensor or a tuple of tensors whose first dimension is the
    batch. The batch dimension is exported as dynamic (1..``max_batch_size``).
    A SentenceTransformer needs no example (it takes text): it is written as an
    embedding model (:func:`gpulab.serving.embedding.export_embedding`).
    """
    from . import embedding

    if embedding.is_sentence_transformer(model):
        return embedding.export_embedding(
            model, model_dir, name=name, max_batch_size=max_batch_size
        )
    example = _as_tuple(example)
    # A batch of 1 makes torch.export specialise the dimension to the constant 1
    # (0/1 specialisation); trace on two rows instead.
    if example[0].shape[0] == 1:
        example = tuple(torch.cat([t, t]) for t in example)
    batch = example[0].shape[0]
    model = model.eval()
    names_in = _input_names(model, len(example), input_names)
    traced = _traceable(model)
    dim = torch.export.Dim("batch", min=1, max=max_batch_size)
    try:
        with torch.no_grad():
            program = torch.export.export(
                traced, example, dynamic_shapes=tuple({0: dim} for _ in example)
            )
    except Exception as exc:
        hint = ""
        if "PackedParams" in str(exc) or "__obj_flatten__" in str(exc):
            hint = f" — {_TORCH_AO_HINT}"
        raise ExportError(
            f"torch.export failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}{hint}"
        ) from exc

    with torch.no_grad():
        out = program.module()(*example)
    names_out, tensors_out, structure = _flatten_outputs(out, output_names)
    for n, t in zip(names_out, tensors_out, strict=False):
        if t.dim() == 0 or t.shape[0] != batch:
            raise ExportError(
                f"output {n!r} has shape {list(t.shape)}; every output must carry "
                f"the batch dimension first (expected {batch} rows)"
            )

    card = ModelCard(
        name=name or getattr(model, "name", None) or type(model).__name__.lower(),
        inputs=[
            TensorSpec(n, _datatype(t, f"input {n!r}"), [-1, *t.shape[1:]])
            for n, t in zip(names_in, example, strict=False)
        ],
        outputs=[
            TensorSpec(n, _datatype(t, f"output {n!r}"), [-1, *t.shape[1:]])
            for n, t in zip(names_out, tensors_out, strict=False)
        ],
        max_batch_size=max_batch_size,
        output_structure=structure,
        requires=["torchao"] if _uses_torchao(model) else [],
    )
    os.makedirs(model_dir, exist_ok=True)
    torch.export.save(program, os.path.join(model_dir, PROGRAM_FILE))
    with open(os.path.join(model_dir, CARD_FILE), "w") as f:
        f.write(card.to_json())
    return card


_TORCH_AO_HINT = (
    "of torch.ao's quantized layers only int8 dynamic linears (%quantize --scheme "
    "int8-dynamic) can be served: quantize the float model with --engine torchao to serve it"
)


def _traceable(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, or a copy whose torch.ao dynamic int8 layers ``torch.export`` can trace."""
    why = dynamic_int8.unsupported(model)
    if why:
        raise ExportError(f"{why}; {_TORCH_AO_HINT}")
    return dynamic_int8.exportable(model) if dynamic_int8.has_dynamic_int8(model) else model


def _uses_torchao(model: torch.nn.Module) -> bool:
    return any(
        type(t).__module__.startswith("torchao") for t in model.state_dict(keep_vars=True).values()
    )


class ServedModel:
    """A loaded model directory: call it with one tensor per input, get one per output."""

    def __init__(self, card: ModelCard, program):
        self.card = card
        self.program = program
        self._module = program.module()

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = self._module(*inputs)
        if self.card.output_structure == "tensor":
            return [out]
        if self.card.output_structure == "dict":
            return [out[k] for k in out]
        return list(out)


def load_model(model_dir: str):
    """The model of ``model_dir``: a :class:`ServedModel`, or for a card of kind
    ``sentence-embedding`` an :class:`~gpulab.serving.embedding.EmbeddingModel`."""
    card_path = os.path.join(model_dir, CARD_FILE)
    program_path = os.path.join(model_dir, PROGRAM_FILE)
    if not os.path.exists(card_path):
        raise FileNotFoundError(
            f"{card_path} is missing; create the model directory with "
            "gpulab.serving.export.export_model(model, example, dir)"
        )
    with open(card_path) as f:
        card = ModelCard.from_json(f.read())
    if card.kind != KIND:
        from . import embedding

        if card.kind != embedding.KIND:
            raise ValueError(
                f"{card_path} has kind {card.kind!r}; this server serves "
                f"{KIND!r} and {embedding.KIND!r}: upgrade gpulab or re-export"
            )
        return embedding.load_embedding(model_dir, card)
    if not os.path.exists(program_path):
        raise FileNotFoundError(
            f"{program_path} is missing; create the model directory with "
            "gpulab.serving.export.export_model(model, example, dir)"
        )
    if "torchao" in card.requires:
        # Programs quantized with torchao hold its tensor subclasses; loading them
        # needs torchao imported first. Plain programs do not (torchao is optional).
        try:
            import torchao  # noqa: F401
        except ImportError:
            raise ImportError(
                f"{model_dir} was quantized with torchao; install it to serve "
                "it: pip install --no-deps torchao==0.18.0"
            ) from None
    return ServedModel(card, torch.export.load(program_path))
