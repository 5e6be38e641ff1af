"""``%deploy`` of a language model: find the causal LM and its tokenizer, write the
``causal-lm`` archive, and say how to call it through the OpenAI-compatible gateway.

    %deploy model --name chat --tokenizer tok --gpu 1/2 [--max-model-len 2048] [--max-num-seqs 16]

MODEL is a transformers causal LM in the notebook (built here, or what a job's
``--out`` brought back), a folder written by ``save_pretrained``, or a Hugging
Face id already in the local cache (nothing is downloaded when ``HF_HUB_OFFLINE``
is set). ``--tokenizer`` takes the same kinds; by default the model's own folder
or id. A causal LM is not traced with ``torch.export`` (its KV cache is not a
tensor tree): its weights, config and tokenizer travel as a Hugging Face folder,
and the replica runs a generation engine over them.
"""

from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError

#: The archive kind of a language model (gpulab.serving.llm_export's card).
KIND = "causal-lm"


def _transformers():
    """transformers if the notebook already imported it (a model object then comes from
    it), else imported now (a folder or an id is being deployed)."""
    import transformers

    return transformers


def is_causal_lm(obj) -> bool:
    """A transformers model that generates text (``can_generate()``): the causal LMs
    ``AutoModelForCausalLM`` gives, and any model a job's ``--out`` built from one."""
    if "transformers" not in sys.modules:
        return False  # cannot be one: nothing imported transformers
    from transformers import PreTrainedModel

    if not isinstance(obj, PreTrainedModel):
        return False
    try:
        return bool(obj.can_generate())
    except Exception:  # noqa: BLE001 - an odd subclass: not one we can serve
        return False


def _is_tokenizer(obj) -> bool:
    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedTokenizerBase

    return isinstance(obj, PreTrainedTokenizerBase)


def wants_llm_route(ns: dict, model: str | None, tokenizer: str | None) -> bool:
    """``%deploy`` takes the language-model route: ``--tokenizer`` was given, or MODEL is
    a causal LM object, or MODEL is not a variable (a folder or a Hugging Face id)."""
    if not model:
        return False
    if tokenizer is not None:
        return True
    if model in ns:
        return is_causal_lm(ns[model])
    # Not a variable name: a folder or a Hugging Face id (the tensor route needs a variable).
    return not model.isidentifier()


def _looks_like_path_or_id(text: str) -> bool:
    return os.path.isdir(os.path.expanduser(text)) or (
        "/" in text and not text.startswith(("/", ".", "~"))
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _load_from(what: str, text: str, loader):
    """``loader.from_pretrained`` of a folder or a cached id, refused in one line."""
    path = os.path.expanduser(text)
    is_dir = os.path.isdir(path)
    if not is_dir and text.startswith(("/", ".", "~")):
        raise UsageError(f"{what} {text!r}: no such folder; give a saved model's folder")
    if is_dir and not os.listdir(path):
        raise UsageError(f"{what} {text!r}: {_NO_FILES}; save it with save_pretrained(folder)")
    try:
        return loader.from_pretrained(path if is_dir else text, local_files_only=_offline() or None)
    except (OSError, ValueError) as e:
        where = (
            _NO_FILES
            if is_dir
            else "not in the local Hugging Face cache"
            + (" (HF_HUB_OFFLINE is set: nothing is downloaded)" if _offline() else "")
        )
        raise UsageError(f"{what} {text!r}: {where}; {str(e).splitlines()[0][:200]}") from None


_NO_FILES = "the folder has no Hugging Face model files (config.json, model.safetensors, tokenizer)"


def resolve_model(ns: dict, text: str):
    """The causal LM MODEL names; UsageError saying what it is otherwise."""
    if text in ns:
        obj = ns[text]
        if is_causal_lm(obj):
            return obj
        kind = type(obj).__name__
        if "transformers" in sys.modules and isinstance(
            obj, sys.modules["transformers"].PreTrainedModel
        ):
            raise UsageError(
                f"{text} is a {kind}, not a causal language model (it cannot generate); "
                f"--tokenizer serves models such as AutoModelForCausalLM's, other models "
                f"deploy with --example X"
            )
        raise UsageError(
            f"{text} is a {kind}, not a transformers causal language model; "
            f"--tokenizer serves those, other torch models deploy with --example X"
        )
    transformers = _transformers()
    model = _load_from("MODEL", text, transformers.AutoModelForCausalLM)
    return model


def resolve_tokenizer(ns: dict, tokenizer: str | None, model_text: str, model):
    """The tokenizer ``--tokenizer`` names, or the one beside the model; UsageError if none."""
    if tokenizer is not None and tokenizer in ns:
        obj = ns[tokenizer]
        if not _is_tokenizer(obj):
            raise UsageError(
                f"--tokenizer {tokenizer}: is a {type(obj).__name__}, not a transformers "
                f"tokenizer; give one (AutoTokenizer.from_pretrained(...)), a folder or an id"
            )
        return obj
    source = tokenizer or _model_source(model_text, model)
    if not source:
        raise UsageError(
            f"no tokenizer found for {model_text}; pass --tokenizer TOK (a tokenizer in the "
            f"notebook, a folder written by save_pretrained, or a Hugging Face id)"
        )
    transformers = _transformers()
    try:
        return _load_from("--tokenizer", source, transformers.AutoTokenizer)
    except UsageError as e:
        if tokenizer is not None:
            raise
        raise UsageError(
            f"no tokenizer found beside {model_text} ({e}); pass --tokenizer TOK"
        ) from None


def _model_source(model_text: str, model) -> str | None:
    """Where the model was loaded from: its folder or id (None for one built in memory)."""
    if not model_text or model_text.isidentifier():
        source = getattr(model, "name_or_path", "") or ""
        return source if source and (_looks_like_path_or_id(source)) else None
    return model_text


def write_archive(model, tokenizer, folder: str, args, adapters: dict | None = None) -> dict:
    """The ``causal-lm`` archive in ``folder`` (``gpulab.serving.llm_export``), with the
    LoRA ``adapters`` ({name: folder}, magics/llm_adapters.py)."""
    from gpulab.serving.export import ExportError
    from gpulab.serving.llm_export import save_causal_lm

    try:
        return save_causal_lm(
            model,
            tokenizer,
            folder,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            name=args.name,
            adapters=adapters or None,
        )
    except ExportError as e:
        # In the magic's words: its flags, not the function's arguments.
        text = str(e).replace("max_model_len", "--max-model-len")
        raise UsageError(text.replace("max_num_seqs", "--max-num-seqs")) from None


def gateway_url(endpoint_url: str) -> str:
    """``<hub>/services/gpulab/v1`` from an endpoint's URL (``<hub>/services/gpulab/...``)."""
    origin = endpoint_url.split("/services/", 1)[0]
    return f"{origin}/services/gpulab/v1"


def model_id(dep: dict, me: str | None) -> str:
    """The ``model`` to send: NAME for one's own endpoint, OWNER/NAME for another's."""
    owner = dep.get("user")
    return dep["name"] if not owner or owner == me else f"{owner}/{dep['name']}"


def llm_usage_lines(dep: dict, base_url: str, model: str) -> str:
    """The gateway's URL, the model id, an ``openai`` snippet and a curl line."""
    scheme = base_url.partition("://")[0]
    own_ca = scheme == "https" and bool(os.environ.get("GPULAB_CA_FILE"))
    cacert = ' --cacert "$GPULAB_CA_FILE"' if own_ca else ""
    http_client = (
        ',\n                  http_client=httpx.Client(verify=os.environ["GPULAB_CA_FILE"])'
        if own_ca
        else ""
    )
    body = (
        f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], '
        f'"max_tokens": 32}}'
    )
    return "\n".join(
        [
            f"OpenAI-compatible base URL: {base_url}",
            f"model: {model}   (others you share it with: {dep.get('user', 'you')}/{dep['name']})",
            "",
            "openai (the API key is a hub token: yours, or of someone it is shared with):",
            "  import os" + (", httpx" if own_ca else ""),
            "  from openai import OpenAI",
            f"  client = OpenAI(base_url={base_url!r},",
            f'                  api_key=os.environ["JUPYTERHUB_API_TOKEN"]{http_client})',
            "  reply = client.chat.completions.create(",
            f"      model={model!r}, messages=[{{'role': 'user', 'content': 'Hello!'}}])",
            "  print(reply.choices[0].message.content)",
            "",
            "curl:",
            f'  curl{cacert} -H "Authorization: Bearer $JUPYTERHUB_API_TOKEN" '
            f"-H 'Content-Type: application/json' \\\n    -d '{body}' \\\n"
            f"    {base_url}/chat/completions",
        ]
    )
