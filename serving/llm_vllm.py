"""vLLM as the engine of a causal-LM replica on an NVIDIA GPU (where it is installed).

Untested on gpulab's CI (no GPU, no vLLM there): :func:`.llm_engine.choose_engine`
picks it only when ``import vllm`` works and CUDA is there. The replica's slice
sets its memory share (``PYTORCH_CUDA_ALLOC_CONF``'s fraction, else 0.9).
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid

from .llm_engine import Engine, QueueFull, SamplingParams


def _memory_share() -> float:
    found = re.search(
        r"per_process_memory_fraction:([0-9.]+)", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    )
    return float(found.group(1)) if found else 0.9


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, hf_dir: str, *, max_num_seqs: int, max_queue: int, max_model_len: int):
        super().__init__(max_num_seqs, max_queue)
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        self.engine = AsyncLLMEngine.from_engine_args(
            AsyncEngineArgs(
                model=hf_dir,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                gpu_memory_utilization=_memory_share(),
            )
        )
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
        self._live = 0

    @property
    def load(self) -> int:
        return self._live

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.engine.shutdown_background_loop() if hasattr(
            self.engine, "shutdown_background_loop"
        ) else None

    async def generate(self, prompt: list[int], params: SamplingParams):
        from vllm import SamplingParams as VllmParams

        if self.load >= self.max_num_seqs + self.max_queue:
            raise QueueFull(f"{self.max_num_seqs} sequences are generating; retry shortly")
        rid = uuid.uuid4().hex
        sp = VllmParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
        )
        self._live += 1
        sent = 0
        try:
            async for out in self.engine.generate({"prompt_token_ids": prompt}, sp, rid):
                ids = out.outputs[0].token_ids
                for t in ids[sent:]:
                    if t in params.stop_token_ids:
                        return
                    yield t
                sent = len(ids)
        finally:
            self._live -= 1
            await asyncio.shield(self.engine.abort(rid))
