"""Load a causal LM's model directory into an :class:`~.openai_routes.LlmServer`.

The card's ``max_model_len`` and ``max_num_seqs`` hold unless the command line
says otherwise (``--max-model-len`` may only lower the context the model was
saved with); the engine is the best this replica can run (:func:`.llm_engine.choose_engine`),
and the server prints which and why, where the replica's log shows it.
"""

from __future__ import annotations

import argparse
import os
import sys

from .llm_engine import MAX_ADMISSION_WINDOW_S, build_engine, choose_engine
from .llm_export import load_causal_lm, read_card
from .openai_routes import LlmServer


async def load_llm_server(args: argparse.Namespace, token: str) -> LlmServer:
    card = read_card(args.model_dir)
    saved_len = int(card["max_model_len"])
    if args.max_model_len is not None:
        if args.max_model_len > saved_len:
            raise ValueError(
                f"--max-model-len {args.max_model_len} is above the {saved_len} tokens "
                f"{card.get('name')!r} was saved with; lower it or save it again"
            )
        card["max_model_len"] = args.max_model_len
    if args.max_num_seqs is not None:
        card["max_num_seqs"] = args.max_num_seqs
    kind, reason = choose_engine(args.engine)
    if kind == "vllm":
        from .llm_vllm import VllmEngine

        engine = VllmEngine(
            os.path.join(args.model_dir, "hf"),
            max_num_seqs=card["max_num_seqs"],
            max_queue=args.max_queue,
            max_model_len=card["max_model_len"],
        )
        model, tokenizer = None, engine.tokenizer
    else:
        try:
            model, tokenizer, _ = load_causal_lm(args.model_dir)
        except (FileNotFoundError, ImportError):
            raise
        except Exception as exc:  # a corrupt or foreign file: say which, not a traceback
            raise ValueError(
                f"cannot load the model in {args.model_dir}: {type(exc).__name__}: {exc}"
            ) from exc
        engine = build_engine(
            kind,
            model,
            max_num_seqs=card["max_num_seqs"],
            max_queue=args.max_queue,
            max_model_len=card["max_model_len"],
            max_admission_window_s=getattr(
                args, "max_admission_window_ms", MAX_ADMISSION_WINDOW_S * 1e3
            )
            / 1e3,
        )
    engine.reason = reason
    server = LlmServer(model, tokenizer, card, engine, token=token)
    # stderr: stdout's first line is the "listening on" line the parent waits for.
    print(f"gpulab-serving: engine: {reason}", file=sys.stderr, flush=True)
    server.engine.start()
    await server.warm_up()
    return server
