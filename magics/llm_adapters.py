"""``%deploy`` of LoRA adapters (PEFT) with their language model: each answers as a
model of its own (``NAME:ADAPTER``) on the same base replicas.

    %deploy base --name chat --tokenizer tok --adapter sql=sql_model --adapter fr=./fr-lora
    %deploy peft_model --name chat --tokenizer tok     (its base, and its adapters by name)

``--adapter NAME=SOURCE``: SOURCE is a PEFT model in the notebook (its active
adapter) or a folder its ``save_pretrained`` wrote. MODEL may itself be a PEFT
model: its base model is served (a copy without the LoRA layers: the notebook's
model is left as it is) and each of its adapters under its PEFT name
(``get_peft_model(base, config, adapter_name="sql")``; PEFT's own default is
``default``). The files go under the archive's ``adapters/<name>/``
(:func:`gpulab.serving.llm_export.save_causal_lm`).
"""

from __future__ import annotations

import copy
import os
import re
import sys

from IPython.core.error import UsageError

#: An adapter's name, as the service accepts it (it becomes part of the model id).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def is_peft_model(obj) -> bool:
    """A PEFT model (LoRA layers over a base model); False without peft imported."""
    if "peft" not in sys.modules or obj is None:
        return False
    from peft import PeftModel

    return isinstance(obj, PeftModel)


def parse(values: list[str] | None) -> list[tuple[str, str]]:
    """``--adapter NAME=SOURCE`` flags as (name, source), refused in one line each."""
    out: list[tuple[str, str]] = []
    for value in values or []:
        name, sep, source = value.partition("=")
        if not sep or not source:
            raise UsageError(
                f"--adapter {value!r}: give NAME=SOURCE (a PEFT model in the notebook or "
                f"the folder its save_pretrained wrote), e.g. --adapter sql=sql_model"
            )
        if not NAME.fullmatch(name):
            raise UsageError(
                f"--adapter {value!r}: the name {name!r} must be letters, digits, '.', '_' "
                f"or '-' (at most 63); it is called as MODEL:{name or 'NAME'}"
            )
        if name in (n for n, _ in out):
            raise UsageError(f"--adapter {name} is given twice; give each adapter once")
        out.append((name, source))
    return out


def base_of(peft_model):
    """The base model without its LoRA layers, as a copy (``unload`` changes the model
    it is called on, and the notebook's model must keep its adapters)."""
    return copy.deepcopy(peft_model).unload()


def _save(peft_model, adapter: str, tmp: str) -> str:
    """One adapter of ``peft_model`` saved in ``tmp``; the folder its files are in."""
    peft_model.save_pretrained(tmp, selected_adapters=[adapter], safe_serialization=True)
    # PEFT writes the adapter named "default" at the top, any other in a folder of its name.
    return tmp if adapter == "default" else os.path.join(tmp, adapter)


def sources(ns: dict, model_obj, flags: list[tuple[str, str]], tmp: str) -> dict[str, str]:
    """``{name: folder}`` of every adapter to serve: MODEL's own (a PEFT model) and
    ``--adapter``'s, each saved under ``tmp`` (the folders save_causal_lm copies)."""
    out: dict[str, str] = {}
    if is_peft_model(model_obj):
        for adapter in model_obj.peft_config:
            if not NAME.fullmatch(adapter):
                raise UsageError(
                    f"the model's adapter {adapter!r}: its name must be letters, digits, "
                    f"'.', '_' or '-'; load it again with adapter_name='sql' or pass it "
                    f"as --adapter NAME=..."
                )
            out[adapter] = _save(model_obj, adapter, os.path.join(tmp, f"own-{adapter}"))
    for name, source in flags:
        if name in out:
            raise UsageError(
                f"--adapter {name}: the model already has an adapter {name!r}; "
                f"give this one another name"
            )
        if source in ns:
            obj = ns[source]
            if not is_peft_model(obj):
                raise UsageError(
                    f"--adapter {name}={source}: {source} is a {type(obj).__name__}, not a "
                    f"PEFT model; give one (get_peft_model(...)) or a folder it saved"
                )
            out[name] = _save(obj, obj.active_adapter, os.path.join(tmp, f"flag-{name}"))
            continue
        folder = os.path.expanduser(source)
        if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
            raise UsageError(
                f"--adapter {name}={source}: neither a variable nor a folder with "
                f"adapter_config.json; give a PEFT model or the folder save_pretrained wrote"
            )
        out[name] = folder
    return out
