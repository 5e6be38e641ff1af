"""Quantization-aware training: ``ctx.wrap(model, qat="int8-int4")``.

The model's ``nn.Linear`` layers train with fake quantization (torchao's QAT,
``QATConfig(step="prepare")``): the forward pass rounds weights and activations as
the quantized model will, so training learns weights that survive the rounding.
``%quantize`` (gpulab.serving.quantize) later converts such a model with the same
scheme (``QATConfig(step="convert")``) and reports it beside post-training
quantization of the same weights.

The model is tagged ``gpulab_qat = "<scheme>"`` so that the conversion knows which
scheme it trained for; the tag travels with the model (``--out``, pickling).
"""

from __future__ import annotations

import logging
import warnings

#: QAT schemes: int8 dynamic activations with int4 weights (per group of 32), as
#: torchao's Int8DynActInt4WeightQATQuantizer; the only one torchao fakes on CPU too.
QAT_SCHEMES = ("int8-int4",)
GROUP_SIZE = 32
TORCHAO_PIN = "torchao==0.18.0"
#: The attribute that marks a model prepared for QAT, with its scheme.
QAT_TAG = "gpulab_qat"


class QATError(ValueError):
    """QAT cannot be set up as asked; the message says what to do instead."""


def base_config(scheme: str):
    """torchao's config for ``scheme`` (the quantization QAT fakes, then applies)."""
    import torch

    if scheme not in QAT_SCHEMES:
        raise QATError(f"unknown QAT scheme {scheme!r}; choose one of {', '.join(QAT_SCHEMES)}")
    tq = _torchao()
    from torchao.quantization.granularity import PerGroup

    return tq.Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP_SIZE)
    )


def prepare(model, scheme: str = "int8-int4"):
    """Fake-quantize ``model``'s linear layers in place for training; returns it."""
    config = base_config(scheme)
    from torchao.quantization.qat import QATConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _torchao().quantize_(model, QATConfig(config, step="prepare"))
    setattr(model, QAT_TAG, scheme)
    return model


def _torchao():
    # torchao's import reports optional GPU kernels it cannot load; not the user's business.
    quiet = logging.getLogger("torchao")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao.quantization as tq
    except ImportError:
        raise QATError(
            f"QAT needs torchao, which is not installed here: pip install --no-deps {TORCHAO_PIN}"
        ) from None
    finally:
        quiet.setLevel(level)
    return tq
