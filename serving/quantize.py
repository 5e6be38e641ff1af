"""Quantize a model by scheme and engine, and measure what it cost and saved.

``quantize(model, scheme, engine="auto", example=x)`` returns a
:class:`QuantizeReport`: the quantized copy (``report.model``; the original is
left alone), serialized size before/after, median latency before/after on
``example``, max-abs and relative output error, and the engine that ran.

Schemes and the engines that run them:

=============  =========================================  ==============================
scheme         torch-ao (``quantize_dynamic``)            torchao 0.18 (``quantize_``)
=============  =========================================  ==============================
int8-dynamic   yes — the CPU fast path (``auto`` on CPU)  Int8DynamicActivationInt8Weight
int8-weight    no                                         Int8WeightOnly
int4-weight    no                                         Int4WeightOnly on CUDA;
                                                          IntxWeightOnly(int4) on CPU
fp8-weight     no                                         Float8WeightOnly
fp8-dynamic    no                                         Float8DynamicActivationFloat8Weight,
                                                          CUDA compute capability >= 8.9 only
int8-int4      no                                         Int8DynamicActivationIntxWeight
                                                          (int4 weights per group of 32)
=============  =========================================  ==============================

A model trained quantization-aware (``ctx.wrap(model, qat="int8-int4")``, tagged
``gpulab_qat``) is converted with its own scheme (torchao's ``QATConfig(step=
"convert")``): its fake-quantized layers become the quantized ones they trained as.
:mod:`.qat` reports it beside post-training quantization.

Which layers are taken is :mod:`.linear_like`'s plan: GPT-2-style ``Conv1D`` layers
become ``nn.Linear`` first, a ``Linear`` tied to the embedding stays in float, and
the report counts what was quantized (and warns when that is little of the model).
For a language model, ``heldout`` token ids add perplexity before and after.

On CPU, int4 weights are stored one value per byte (torchao's
``IntxUnpackedToInt8Tensor``), so they are no smaller than int8; fp8 weights are
stored as float8 and widened for every matmul (smaller, not faster).
"""

from __future__ import annotations

import copy
import io
import logging
import statistics
import time
import warnings
from dataclasses import dataclass, field

import torch

from .linear_like import Plan, convert_conv1d, plan

SCHEMES = ("int8-dynamic", "int8-weight", "int4-weight", "fp8-weight", "fp8-dynamic", "int8-int4")
#: What marks a model trained quantization-aware (gpulab.training.qat), with its scheme.
QAT_TAG = "gpulab_qat"
ENGINES = ("auto", "torch-ao", "torchao")
TORCHAO_PIN = "torchao==0.18.0"
#: Below this share of the parameters quantized, the report warns: the size and speed
#: it shows are mostly the float model's.
LITTLE_QUANTIZED = 0.5


class QuantizeError(ValueError):
    """The scheme, engine or hardware cannot do this; the message says what to do instead."""


@dataclass
class QuantizeReport:
    scheme: str
    engine: str
    size_before: int  # bytes of the serialized state_dict
    size_after: int
    latency_before_s: float  # median over `runs` calls on the example
    latency_after_s: float
    max_abs_error: float
    relative_error: float  # ||q(x) - m(x)|| / ||m(x)||
    runs: int
    device: str
    notes: list[str] = field(default_factory=list)
    model: torch.nn.Module | None = field(default=None, repr=False)
    layers_quantized: int = 0  # nn.Linear layers (Conv1D counted once converted)
    layers_converted: int = 0  # of them, GPT-2-style Conv1D layers made nn.Linear
    params_share: float = 0.0  # share of the model's parameters quantized (0-1)
    warnings: list[str] = field(default_factory=list)
    perplexity_before: float | None = None  # on the held-out tokens, if given
    perplexity_after: float | None = None
    heldout_tokens: int = 0

    @property
    def size_ratio(self) -> float:
        """How many times smaller the quantized model is (before / after)."""
        return self.size_before / self.size_after if self.size_after else float("nan")

    @property
    def speedup(self) -> float:
        """How many times faster the quantized model is (before / after)."""
        return (
            self.latency_before_s / self.latency_after_s if self.latency_after_s else float("nan")
        )

    def table(self) -> str:
        rows = [
            ("", "before", "after", "ratio"),
            (
                "size",
                _mib(self.size_before),
                _mib(self.size_after),
                _ratio(self.size_ratio, "smaller", "larger"),
            ),
            (
                f"latency (median of {self.runs})",
                _ms(self.latency_before_s),
                _ms(self.latency_after_s),
                _ratio(self.speedup, "faster", "slower"),
            ),
        ]
        if self.perplexity_before is not None:
            rows.append(
                (
                    f"perplexity ({self.heldout_tokens} held-out tokens)",
                    f"{self.perplexity_before:.3f}",
                    f"{self.perplexity_after:.3f}",
                    _change(self.perplexity_after / self.perplexity_before),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"{self.scheme} with engine {self.engine} on {self.device}"]
        lines += [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows
        ]
        lines.append(
            f"output error: max-abs {self.max_abs_error:.3g}, relative {self.relative_error:.3g}"
        )
        converted = f", {self.layers_converted} of them Conv1D" if self.layers_converted else ""
        lines.append(
            f"quantized: {self.layers_quantized} linear layers{converted}, "
            f"{self.params_share:.0%} of the parameters"
        )
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _ratio(r: float, better: str, worse: str) -> str:
    return f"{r:.2f}x {better}" if r >= 1 or r != r else f"{1 / r:.2f}x {worse}"


def _change(r: float) -> str:
    """Perplexity after / before: lower is better."""
    return f"{r:.3f}x" + (" (higher)" if r > 1 else " (lower)" if r < 1 else "")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def serialized_size(model: torch.nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def _device(model: torch.nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def _check_hardware(scheme: str, device: torch.device) -> None:
    if scheme != "fp8-dynamic":
        return
    if device.type != "cuda":
        raise QuantizeError(
            f"fp8-dynamic needs an NVIDIA GPU with compute capability >= 8.9 (Ada, Hopper or "
            f"newer) and the model on it; this model is on {device.type}. On CPU use "
            f"int8-dynamic (fastest) or fp8-weight (smaller)"
        )
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        raise QuantizeError(
            f"fp8-dynamic needs compute capability >= 8.9; "
            f"{torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}. "
            f"Use int8-dynamic or int8-weight on this GPU"
        )


def resolve_engine(scheme: str, engine: str, device: torch.device) -> str:
    if scheme not in SCHEMES:
        raise QuantizeError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if engine not in ENGINES:
        raise QuantizeError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "auto":
        # quantize_dynamic is the fastest int8-dynamic path on CPU; torchao everywhere else.
        engine = "torch-ao" if scheme == "int8-dynamic" and device.type == "cpu" else "torchao"
    if engine == "torch-ao" and scheme != "int8-dynamic":
        raise QuantizeError(
            f"engine torch-ao (torch.ao quantize_dynamic) only does int8-dynamic; "
            f"use engine torchao (or auto) for {scheme}"
        )
    if engine == "torch-ao" and device.type != "cpu":
        raise QuantizeError(
            f"engine torch-ao (quantize_dynamic) runs only on the CPU; the model is "
            f"on {device.type}: use engine torchao, or model.cpu()"
        )
    return engine


def _import_torchao():
    # torchao's import reports optional GPU kernels it cannot load and a torch
    # deprecation; none of it is the user's business in a notebook.
    noisy = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in noisy]
    try:
        for log in noisy:
            log.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao.quantization as tq
    except ImportError:
        raise QuantizeError(
            f"engine torchao is not installed; pip install --no-deps "
            f"{TORCHAO_PIN}, or use --engine torch-ao for int8-dynamic"
        ) from None
    finally:
        for log, level in zip(
            noisy[1:], levels[1:], strict=False
        ):  # torchao's own logger stays quiet
            log.setLevel(level)
    return tq


def _torchao_config(scheme: str, device: torch.device, notes: list[str]):
    tq = _import_torchao()
    if scheme == "int8-dynamic":
        return tq.Int8DynamicActivationInt8WeightConfig()
    if scheme == "int8-weight":
        return tq.Int8WeightOnlyConfig()
    if scheme == "int4-weight":
        if device.type == "cuda":
            return tq.Int4WeightOnlyConfig(group_size=128)
        from torchao.quantization.granularity import PerGroup

        notes.append(
            "int4 on CPU: IntxWeightOnly stores one int4 value per byte, "
            "so the size is that of int8"
        )
        return tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    if scheme == "fp8-weight":
        if device.type != "cuda":
            notes.append(
                "fp8 weights on CPU are stored as float8_e4m3 and widened for every "
                "matmul: smaller, not faster"
            )
        return tq.Float8WeightOnlyConfig()
    if scheme == "int8-int4":
        from torchao.quantization.granularity import PerGroup

        # The same as gpulab.training.qat's, which a QAT model trained for.
        return tq.Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(32)
        )
    return tq.Float8DynamicActivationFloat8WeightConfig()


def _apply(
    model: torch.nn.Module,
    scheme: str,
    engine: str,
    device: torch.device,
    notes: list[str],
    layers: list[str],
) -> torch.nn.Module:
    """Quantize the ``nn.Linear`` layers named in ``layers`` (and no other)."""
    chosen = set(layers)
    if engine == "torch-ao":
        qconfig = torch.ao.quantization.default_dynamic_qconfig
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in favour of torchao, still the fastest
            return torch.ao.quantization.quantize_dynamic(
                model, {name: qconfig for name in layers}, dtype=torch.qint8
            )
    config = _torchao_config(scheme, device, notes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if getattr(model, QAT_TAG, None):  # its fake-quantized layers, converted
                from torchao.quantization.qat import QATConfig

                _import_torchao().quantize_(model, QATConfig(config, step="convert"))
                notes.append(f"trained quantization-aware for {scheme}: converted as trained")
                return model
            _import_torchao().quantize_(
                model,
                config,
                filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear) and fqn in chosen,
            )
    except (ImportError, NotImplementedError, AssertionError, RuntimeError) as exc:
        raise QuantizeError(
            f"torchao cannot run {scheme} on {device.type} here: {type(exc).__name__}: {exc}"
        ) from exc
    return model


def output_tensors(out) -> list[torch.Tensor]:
    """A model's output as a list of tensors (a tensor, a tuple, a dict's values)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [t for t in out if isinstance(t, torch.Tensor)]


def call_model(model, example):
    """``model(example)``, or ``model(*example)`` for a tuple of inputs."""
    return model(*example) if isinstance(example, tuple) else model(example)


def median_latency(model: torch.nn.Module, example, runs: int = 20, warmup: int = 3) -> float:
    return paired_latency([model], example, runs, warmup)[0]


def paired_latency(
    models: list[torch.nn.Module], example, runs: int = 20, warmup: int = 3
) -> list[float]:
    """The median seconds per call of each model on ``example``, runs interleaved.

    Each round calls every model once, in turn: on a machine others share, a burst of
    load then slows both alike instead of whichever model happened to be timed
    during it (timing all of one, then all of the other, reported one model 3x
    "slower" when only its neighbours had changed).
    """
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for _ in range(warmup):
            for model in models:
                call_model(model, example)
        for _ in range(runs):
            for model, spent in zip(models, times, strict=True):
                start = time.perf_counter()
                call_model(model, example)
                spent.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _logits(out) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out if isinstance(out, torch.Tensor) else output_tensors(out)[0]
    return logits


def perplexity(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """exp of the mean next-token cross-entropy of ``model`` on ``ids`` ``(B, T)``."""
    with torch.inference_mode():
        logits = _logits(model(ids)).float()
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )
    return float(torch.exp(loss))


def _heldout_ids(heldout) -> torch.Tensor:
    if not isinstance(heldout, torch.Tensor) or heldout.is_floating_point():
        raise QuantizeError(
            f"held-out text must be token ids (an integer tensor, shape (T,) or (B, T)), "
            f"got {type(heldout).__name__}"
        )
    ids = heldout.unsqueeze(0) if heldout.dim() == 1 else heldout
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise QuantizeError(
            f"held-out token ids must be (T,) or (B, T) with T >= 2, got {tuple(heldout.shape)}"
        )
    return ids.long()


def _layer_words(p: Plan, converted: list[str]) -> tuple[list[str], list[str]]:
    """Notes on what stayed in float, and warnings when little was quantized."""
    notes, warns = [], []
    if converted:
        notes.append(
            f"{len(converted)} GPT-2-style Conv1D layers ({_names(converted)}) were "
            f"quantized as the nn.Linear they compute"
        )
    for linear, shared in p.tied.items():
        notes.append(
            f"{linear} kept in float: its weight is tied to {shared}; quantizing it would "
            f"store a second copy and make the model larger"
        )
    if p.other:
        kinds = sorted(set(p.other.values()))
        notes.append(
            f"not quantized (no quantizer takes {', '.join(kinds)}): {_names(list(p.other))}"
        )
    if p.share < LITTLE_QUANTIZED:
        warns.append(
            f"only {p.share:.0%} of the parameters were quantized ({len(p.linear)} linear "
            f"layers); the rest stays in float, so size and speed barely change"
        )
    return notes, warns


def _names(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def quantize(
    model: torch.nn.Module,
    scheme: str,
    engine: str = "auto",
    example=None,
    runs: int = 20,
    heldout=None,
) -> QuantizeReport:
    """Quantize a copy of ``model`` with ``scheme`` and measure it on ``example`` (and,
    given ``heldout`` token ids, its perplexity before and after)."""
    if not isinstance(model, torch.nn.Module):
        raise QuantizeError(f"expected a torch.nn.Module to quantize, got {type(model).__name__}")
    if example is None:
        raise QuantizeError(
            "an example input is needed to measure latency and error "
            "(a tensor, or a tuple of tensors for several inputs)"
        )
    if isinstance(example, list):
        example = tuple(example)
    if not isinstance(example, (torch.Tensor, tuple)):
        raise QuantizeError(
            f"example must be a tensor or a tuple of tensors, got {type(example).__name__}"
        )
    ids = None if heldout is None else _heldout_ids(heldout)
    trained_for = getattr(model, QAT_TAG, None)
    if trained_for and scheme != trained_for:
        raise QuantizeError(
            f"this model trained quantization-aware for {trained_for}; quantize it with "
            f"--scheme {trained_for} (or train it again with qat={scheme!r})"
        )
    device = _device(model)
    engine = resolve_engine(scheme, engine, device)
    _check_hardware(scheme, device)

    model = model.eval()
    copied = copy.deepcopy(model)
    converted = convert_conv1d(copied)
    layers = plan(copied)
    if not layers.linear:
        why = [f"{n} is tied to {s}" for n, s in layers.tied.items()]
        why += [f"{n} is a {kind}" for n, kind in layers.other.items()][:4]
        raise QuantizeError(
            "nothing to quantize: the model has no torch.nn.Linear (or GPT-2 Conv1D) "
            "layers a quantizer can take" + (f" ({'; '.join(why)})" if why else "")
        )
    notes, warns = _layer_words(layers, converted)
    with torch.inference_mode():
        reference = output_tensors(call_model(model, example))
    quantized = _apply(copied, scheme, engine, device, notes, layers.linear).eval()
    with torch.inference_mode():
        got = output_tensors(call_model(quantized, example))
    diff = torch.cat(
        [(g.float() - r.float()).flatten() for g, r in zip(got, reference, strict=False)]
    )
    ref = torch.cat([r.float().flatten() for r in reference])
    before_s, after_s = paired_latency([model, quantized], example, runs)
    ppl = (perplexity(model, ids), perplexity(quantized, ids)) if ids is not None else (None, None)
    return QuantizeReport(
        scheme=scheme,
        engine=engine,
        size_before=serialized_size(model),
        size_after=serialized_size(quantized),
        latency_before_s=before_s,
        latency_after_s=after_s,
        max_abs_error=diff.abs().max().item() if diff.numel() else 0.0,
        relative_error=(diff.norm() / ref.norm()).item() if ref.norm() > 0 else diff.norm().item(),
        runs=runs,
        device=str(device),
        notes=notes,
        model=quantized,
        layers_quantized=len(layers.linear),
        layers_converted=len(converted),
        params_share=layers.share,
        warnings=warns,
        perplexity_before=ppl[0],
        perplexity_after=ppl[1],
        heldout_tokens=0 if ids is None else ids.numel(),
    )
