"""Hugging Face ``Trainer`` (and Accelerate through it) reporting to gpulab's live chart.

:class:`GpulabCallback` is a ``TrainerCallback`` whose ``on_log`` hands the
Trainer's logs (``loss``, ``learning_rate``, ``grad_norm``, ``epoch`` ...) to
:func:`gpulab.training.report`, at the Trainer's global step. Inside a gpulab job
it is added to every Trainer without a change to the script: the rank's runner
calls :func:`add_when_imported`, which appends it to
``transformers.trainer.DEFAULT_CALLBACKS`` as soon as that module is imported
(never importing transformers itself: a job that does not use it pays nothing).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import numbers
import sys

from .metrics import report

TRAINER_MODULE = "transformers.trainer"

_class = None


def _on_log(self, args, state, control, logs=None, **kwargs):
    values = {
        k: v
        for k, v in (logs or {}).items()
        if isinstance(v, numbers.Number) and not isinstance(v, bool)
    }
    if values:
        report(step=state.global_step, total_steps=state.max_steps or None, **values)
    return control


def callback_class():
    """``GpulabCallback``, made on first use: importing this module must not import
    transformers (the runner does so in every job)."""
    global _class
    if _class is None:
        from transformers import TrainerCallback

        _class = type(
            "GpulabCallback",
            (TrainerCallback,),
            {
                "__doc__": "Report the Trainer's logged values to gpulab (metrics, live chart).",
                "__module__": __name__,
                "on_log": _on_log,
            },
        )
    return _class


def __getattr__(name):
    if name == "GpulabCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _add(trainer_module) -> None:
    callbacks = trainer_module.DEFAULT_CALLBACKS
    cls = callback_class()
    if cls not in callbacks:
        callbacks.append(cls)


class _AfterTrainerImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``transformers.trainer`` so the
    callback is added right after that module runs."""

    def find_spec(self, name, path, target=None):
        if name != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _add(module)

        spec.loader.exec_module = exec_module
        return spec


def add_when_imported() -> None:
    """Add :class:`GpulabCallback` to every Trainer this process makes."""
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        _add(module)
    elif not any(isinstance(f, _AfterTrainerImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTrainerImport())
