"""Quantization-aware training beside post-training quantization.

``compare(qat_model, float_model, scheme, example, accuracy=(inputs, labels))``
converts the QAT-trained model (:func:`.quantize.quantize`, which knows it by its
``gpulab_qat`` tag) and quantizes ``float_model`` (the same network trained without
QAT) post-training with the same scheme, and reports the float model, its PTQ copy
and the QAT model side by side: serialized size, accuracy on the labelled data, and
output error on ``example`` against the model each came from (PTQ: the float model;
QAT: itself as trained, fake-quantized). Converting a QAT model is quantizing its
weights post-training; what QAT adds is weights trained to survive it, so the
comparison that says something is against a model trained without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quantize import (
    QAT_TAG,
    QuantizeError,
    call_model,
    output_tensors,
    quantize,
    serialized_size,
)


@dataclass
class Row:
    name: str
    size: int  # bytes of the serialized state_dict
    accuracy: float | None  # 0-1 on the labelled data, if given
    relative_error: float | None  # against the float model's outputs on the example


@dataclass
class QatComparison:
    scheme: str
    rows: list[Row]  # float (no QAT), PTQ of it, QAT
    model: torch.nn.Module  # the converted QAT model

    def table(self) -> str:
        head = ("", "size", "accuracy", "output error (vs the model it came from)")
        cells = [head] + [
            (
                r.name,
                f"{r.size / 1024:.1f} KiB",
                "-" if r.accuracy is None else f"{r.accuracy:.1%}",
                "-" if r.relative_error is None else f"relative {r.relative_error:.3g}",
            )
            for r in self.rows
        ]
        widths = [max(len(c[i]) for c in cells) for i in range(4)]
        lines = [f"{self.scheme}: quantization-aware training beside post-training quantization"]
        lines += [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
        ]
        return "\n".join(lines)


def accuracy_of(model: torch.nn.Module, data) -> float:
    """Share of ``data = (inputs, labels)`` whose argmax output is the label."""
    inputs, labels = data
    with torch.inference_mode():
        logits = output_tensors(call_model(model, inputs))[0]
    return float((logits.argmax(-1) == labels).float().mean())


def _error(model, source, example) -> float:
    """Relative output error of ``model`` against ``source`` on ``example``."""
    with torch.inference_mode():
        got = torch.cat([t.float().flatten() for t in output_tensors(call_model(model, example))])
        ref = torch.cat([t.float().flatten() for t in output_tensors(call_model(source, example))])
    return float((got - ref).norm() / ref.norm())


def compare(
    qat_model: torch.nn.Module,
    float_model: torch.nn.Module,
    scheme: str,
    example,
    accuracy=None,
    runs: int = 5,
) -> QatComparison:
    """The float model, its post-training quantization with ``scheme``, and the
    QAT model converted, side by side."""
    if not getattr(qat_model, QAT_TAG, None):
        raise QuantizeError(
            "this model was not trained quantization-aware: train it with "
            f'ctx.wrap(model, qat="{scheme}") (or compare post-training schemes with %quantize)'
        )
    if getattr(float_model, QAT_TAG, None):
        raise QuantizeError("the model to quantize post-training must be one trained without QAT")
    if accuracy is not None and not (isinstance(accuracy, tuple) and len(accuracy) == 2):
        raise QuantizeError("accuracy data must be a pair (inputs, labels)")
    float_model = float_model.eval()
    qat_model = qat_model.eval()
    ptq = quantize(float_model, scheme, example=example, runs=runs).model
    qat = quantize(qat_model, scheme, example=example, runs=runs).model
    rows = []
    for name, model, source in (
        ("float (no QAT)", float_model, None),
        (f"PTQ {scheme}", ptq, float_model),
        (f"QAT {scheme}", qat, qat_model),
    ):
        rows.append(
            Row(
                name=name,
                size=serialized_size(model),
                accuracy=None if accuracy is None else accuracy_of(model, accuracy),
                relative_error=None if source is None else _error(model, source, example),
            )
        )
    return QatComparison(scheme=scheme, rows=rows, model=qat)
