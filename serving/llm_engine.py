"""Engines that generate tokens for many requests at once (continuous batching).

An engine takes token ids in and streams token ids out; the OpenAI routes
(:mod:`.openai_routes`) tokenize, apply the chat template, detokenize and watch
for stop strings. Three engines, one interface (:class:`Engine`):

* :class:`StepBatchEngine` — ours: one thread steps a batch of sequences with a
  key/value cache. A request that arrives joins at the next step (its prompt is
  prefilled, its cache merged into the batch's), a finished or cancelled one
  leaves at the next step, so the batch never waits for its slowest member.
  Measured the fastest on CPU (``benchmarks/llm_engines.py``), so it is the
  default where vLLM cannot run.
* :class:`TransformersCBEngine` — transformers' paged ``ContinuousBatchingManager``
  (``model.init_continuous_batching()``), kept as the measured alternative
  (``--engine transformers-cb``).
* vLLM — on NVIDIA GPUs when ``import vllm`` works (:func:`choose_engine` says so
  and why); it is built by :mod:`.llm_vllm`.

Everything an engine does to the model happens on its one thread; the event loop
only enqueues requests and receives tokens (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

#: The engine names ``--engine`` takes.
ENGINES = ("auto", "step-batch", "transformers-cb", "vllm")


#: The longest an idle engine waits for a burst's other requests (see _gather_arrivals),
#: by default; the replica's ``--max-admission-window-ms`` (0: no wait).
MAX_ADMISSION_WINDOW_S = 0.1
MIN_ARRIVAL_GAP_S = 0.001
#: After a prefill, the longest the engine thread waits for the event loop to take
#: the first tokens out before it decodes again (see _let_first_tokens_out).
FIRST_TOKENS_WAIT_S = 0.02


def admission_deadline(
    first: float, last: float, waiting: int, prompt_s: float, max_window_s: float
) -> float:
    """When an idle engine stops waiting for more of a burst and prefills what came:
    ``first`` and ``last`` are when the first and the latest waiting request came,
    ``waiting`` how many wait, ``prompt_s`` one prompt's share of a prefill pass.

    The pass the waiting requests would take is ``waiting * prompt_s``: the engine
    waits at most that long from the first arrival (``max_window_s`` at most), and
    no longer than a quarter of it after the latest arrival. Waiting costs those
    already there; not waiting makes a late one wait for that whole pass and then
    pay a pass of its own, so the more have come, the longer a pause between two
    arrivals is worth sitting out (traced through the gateway on 2 loaded cores:
    16 requests reached the replica over 25 to 60 ms, 5 to 12 ms apart at times; a
    window of one prompt's time split such a burst, and the 14 late ones waited for
    the first 2's pass). A lone request still waits a quarter of its own pass."""
    if max_window_s <= 0:
        return first
    pending = waiting * prompt_s
    window = min(pending, max_window_s)
    gap = max(min(pending / 4, window), MIN_ARRIVAL_GAP_S)
    return min(first + window, last + gap)


class QueueFull(Exception):
    """Every slot is taken and the waiting line is full: answer 429."""


class EngineStopped(Exception):
    """The engine was stopped or failed; the message says why."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    adapter: str | None = None  # a LoRA adapter's name (a PEFT model's); None: the base


@dataclass
class _Sequence:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    generated: int = 0
    cancelled: bool = False
    generator: torch.Generator | None = None
    # Batch state (StepBatchEngine): tokens seen so far, for the next position id.
    length: int = 0
    last: int = 0
    extra: dict = field(default_factory=dict)
    t_submit: float = field(default_factory=time.perf_counter)

    def emit(self, item) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


_DONE = object()


class Engine:
    """Streams the completion tokens of a prompt; at most ``max_num_seqs`` sequences
    decode at once and ``max_queue`` more may wait, beyond that :class:`QueueFull`."""

    name = "engine"

    def __init__(self, max_num_seqs: int = 16, max_queue: int = 64):
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.reason = self.name
        #: Tokens made for all requests (``/metrics``): a cancelled sequence stops adding.
        self.tokens_made = 0

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    @property
    def load(self) -> int:
        """Sequences running or waiting."""
        raise NotImplementedError

    def _submit(self, seq: _Sequence) -> None:
        raise NotImplementedError

    def _cancel(self, seq: _Sequence) -> None:
        seq.cancelled = True

    async def generate(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[int]:
        """Token ids as they are made. Closing the iterator early (a client that went
        away) cancels the sequence and frees its slot at the engine's next step."""
        if self.load >= self.max_num_seqs + self.max_queue:
            raise QueueFull(
                f"{self.max_num_seqs} sequences are generating and {self.max_queue} "
                "wait; retry shortly"
            )
        seq = _Sequence(list(prompt), params, asyncio.get_running_loop(), asyncio.Queue())
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        self._submit(seq)
        try:
            while True:
                item = await seq.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._cancel(seq)


def sample(logits: torch.Tensor, seqs: list[_Sequence]) -> list[int]:
    """One token per row of ``logits`` [n, vocab], each row with its sequence's settings."""
    logits = logits.float()
    greedy = logits.argmax(-1).tolist()
    tokens = []
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.temperature <= 0:
            tokens.append(greedy[i])
            continue
        probs = torch.softmax(logits[i] / p.temperature, -1)
        if p.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            # Keep the smallest head whose mass reaches top_p (the first token always).
            keep = sorted_p.cumsum(-1) - sorted_p < p.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        tokens.append(int(torch.multinomial(probs, 1, generator=seq.generator)))
    return tokens


class StepBatchEngine(Engine):
    """Continuous batching of our own over a padded batch cache (``DynamicCache``).

    Rows are left-padded to one length; the attention mask hides the padding and
    each row's position ids count only its own tokens. A step is: prefill the
    newcomers together (their first tokens come out: time to first token is one
    prefill), merge their cache into the batch's, then one decode step for all
    (skipped while more newcomers wait: prefills first). An idle engine waits a
    moment for a burst's requests before the first prefill (:meth:`_gather_arrivals`).
    Rows that finish are dropped with ``index_select``; columns that only padding
    holds any more are trimmed, so the cache is as long as the longest live row.
    """

    name = "step-batch"

    def __init__(
        self,
        model,
        max_num_seqs: int = 16,
        max_queue: int = 64,
        max_admission_window_s: float = MAX_ADMISSION_WINDOW_S,
    ):
        super().__init__(max_num_seqs, max_queue)
        self.model = model
        #: The longest an idle engine waits for a burst (:func:`admission_deadline`).
        self.max_admission_window_s = max_admission_window_s
        self.reason = "gpulab continuous batching on transformers"
        #: LoRA adapters of a PEFT model: rows of one batch may each use another.
        self.adapters = set(getattr(model, "peft_config", {}) or {})
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._running: list[_Sequence] = []
        #: Taken off the waiting line, being prefilled (until merged into the batch).
        self._admitted: list[_Sequence] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._cache = None
        self._mask: torch.Tensor | None = None
        self.steps = 0
        #: A prefill pass's time over its prompts (a moving average; one prompt alone:
        #: its whole pass): the admission window's scale.
        self.prompt_prefill_s = 0.0
        #: Prefill passes run, and the requests they prefilled (a burst gathered into
        #: one pass: one more pass, as many more requests).
        self.prefills = 0
        self.prefilled = 0

    @property
    def load(self) -> int:
        return len(self._waiting) + len(self._admitted) + len(self._running)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def _submit(self, seq: _Sequence) -> None:
        with self._wake:
            if self._stopping:
                raise EngineStopped("the engine is stopping")
            self._waiting.append(seq)
            self._wake.notify()

    def _cancel(self, seq: _Sequence) -> None:
        seq.cancelled = True
        # One still waiting leaves the line at once.
        with self._wake, contextlib.suppress(ValueError):
            self._waiting.remove(seq)

    # -- the engine thread ------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._stopping and not self._waiting and not self._running:
                        self._wake.wait()
                    if self._stopping:
                        break
                    if not self._running:
                        self._gather_arrivals()
                    room = self.max_num_seqs - len(self._running)
                    new = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                    self._admitted = new
                try:
                    self._step([s for s in new if not s.cancelled])
                    self._admitted = []  # all cancelled while waiting: none was merged
                except Exception as exc:  # the model failed: every request hears it
                    self._fail(EngineStopped(f"generation failed: {type(exc).__name__}: {exc}"))
        self._fail(EngineStopped("the model server is stopping"))

    def _gather_arrivals(self) -> None:
        """An idle engine that a request wakes waits a moment for the requests arriving
        with it, so that a burst is prefilled in one pass (until
        :func:`admission_deadline`, or the batch is full). Over HTTP a burst reaches
        the replica spread out, and a pass started on the first arrival also slows
        the event loop taking the others; each extra pass costs its fixed part again
        (measured, 2 loaded cores: one 40-token prompt 116 ms a pass, 16 of them
        1.25 s). Scaled by the measured time (a loaded machine takes longer for
        both), so a lone request waits a quarter of its own prefill. Called with
        ``_wake`` held; ``wait`` lets the event loop submit meanwhile."""
        first = self._waiting[0].t_submit
        while not self._stopping and 0 < len(self._waiting) < self.max_num_seqs:
            until = admission_deadline(
                first,
                self._waiting[-1].t_submit,
                len(self._waiting),
                self.prompt_prefill_s,
                self.max_admission_window_s,
            )
            now = time.perf_counter()
            if now >= until:
                return
            self._wake.wait(until - now)

    def _fail(self, error: Exception) -> None:
        with self._wake:
            everyone = self._admitted + self._running + list(self._waiting)
            self._running, self._cache, self._mask = [], None, None
            self._admitted = []
            self._waiting.clear()
        for seq in everyone:
            seq.emit(error)

    def _step(self, new: list[_Sequence]) -> None:
        """Prefill ``new``, then decode one token for every running row, unless more
        requests arrived during the prefill and there is room: they are prefilled
        first, so a request's first token waits for at most the pass under way, not
        for a decode too. Running rows wait at most for ``max_num_seqs`` admissions
        (vLLM's scheduler also puts prefills first)."""
        if new:
            self._prefill(new)
            self._drop_finished()
            if self._more_to_admit():
                self.steps += 1
                return
        if self._running:
            self._decode()
            self._drop_finished()
        self.steps += 1

    def _more_to_admit(self) -> bool:
        with self._wake:
            return bool(self._waiting) and len(self._running) < self.max_num_seqs

    def _forward(self, ids, mask, positions, cache, seqs):
        extra = {}
        if self.adapters:  # PEFT's mixed batches: each row its adapter, or none
            extra["adapter_names"] = [s.params.adapter or "__base__" for s in seqs]
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )

    def _prefill(self, new: list[_Sequence]) -> None:
        from transformers import DynamicCache

        width = max(len(s.prompt) for s in new)
        ids = torch.zeros(len(new), width, dtype=torch.long)
        mask = torch.zeros(len(new), width, dtype=torch.long)
        for i, s in enumerate(new):
            ids[i, width - len(s.prompt) :] = torch.tensor(s.prompt)
            mask[i, width - len(s.prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        started = time.perf_counter()
        out = self._forward(ids, mask, positions, cache, new)
        took = (time.perf_counter() - started) / len(new)
        last = self.prompt_prefill_s
        self.prompt_prefill_s = took if not last else 0.7 * last + 0.3 * took
        self.prefills += 1
        self.prefilled += len(new)
        tokens = sample(out.logits[:, -1], new)
        for s, t in zip(new, tokens, strict=True):
            s.length = len(s.prompt)
            self._emit(s, t)
        self._merge(out.cache, mask, new)
        self._let_first_tokens_out(new)

    def _let_first_tokens_out(self, seqs: list[_Sequence]) -> None:
        """Wait (FIRST_TOKENS_WAIT_S at most) until the event loops of ``seqs`` have
        taken their first tokens: a decode started at once holds the cores (and
        the GIL between its ops) while the replica's loop detokenizes and writes
        16 first chunks; traced through the gateway, they reached the service 15 to
        20 ms after the prefill. The loop runs the second hop after the tasks the
        tokens woke (callbacks run in order), so that is when they are out."""
        waits = []
        for loop in {s.loop for s in seqs}:
            out = threading.Event()
            try:
                loop.call_soon_threadsafe(loop.call_soon, out.set)
            except RuntimeError:  # that loop is closed: nobody to wait for
                continue
            waits.append(out)
        deadline = time.perf_counter() + FIRST_TOKENS_WAIT_S
        for out in waits:
            out.wait(max(0.0, deadline - time.perf_counter()))

    def _merge(self, cache, mask: torch.Tensor, new: list[_Sequence]) -> None:
        if self._cache is None:
            self._cache, self._mask, self._running = cache, mask, list(new)
            self._admitted = []
            return
        old_len, new_len = self._mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for old_layer, new_layer in zip(self._cache.layers, cache.layers, strict=True):
            for attr in ("keys", "values"):
                a, b = getattr(old_layer, attr), getattr(new_layer, attr)
                a = torch.nn.functional.pad(a, (0, 0, width - old_len, 0))
                b = torch.nn.functional.pad(b, (0, 0, width - new_len, 0))
                setattr(old_layer, attr, torch.cat([a, b], 0))
        self._mask = torch.cat(
            [
                torch.nn.functional.pad(self._mask, (width - old_len, 0)),
                torch.nn.functional.pad(mask, (width - new_len, 0)),
            ],
            0,
        )
        self._running.extend(new)
        self._admitted = []

    def _decode(self) -> None:
        seqs = self._running
        ids = torch.tensor([[s.last] for s in seqs])
        positions = torch.tensor([[s.length] for s in seqs])
        self._mask = torch.cat([self._mask, torch.ones(len(seqs), 1, dtype=torch.long)], 1)
        out = self._forward(ids, self._mask, positions, self._cache, seqs)
        self._cache = out.cache
        for s, t in zip(seqs, sample(out.logits[:, -1], seqs), strict=True):
            s.length += 1
            self._emit(s, t)

    def _emit(self, seq: _Sequence, token: int) -> None:
        if seq.cancelled:
            return
        seq.last = token
        seq.generated += 1
        self.tokens_made += 1
        if token in seq.params.stop_token_ids:
            seq.cancelled = True  # an end-of-sequence token is not part of the text
            seq.emit(_DONE)
            return
        seq.emit(token)
        if seq.generated >= seq.params.max_tokens:
            seq.cancelled = True
            seq.emit(_DONE)

    def _drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self._running) if not s.cancelled]
        if len(keep) == len(self._running):
            return
        if not keep:
            self._running, self._cache, self._mask = [], None, None
            return
        index = torch.tensor(keep)
        self._running = [self._running[i] for i in keep]
        self._mask = self._mask.index_select(0, index)
        # Columns only padding holds (the rows that needed them left): trimmed.
        first = int(self._mask.any(0).long().argmax())
        self._mask = self._mask[:, first:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]


class TransformersCBEngine(Engine):
    """transformers' ``ContinuousBatchingManager`` (paged attention, its own thread)."""

    name = "transformers-cb"

    #: Tokens in one page of the paged cache.
    PAGE = 64

    def __init__(
        self, model, max_num_seqs: int = 16, max_queue: int = 64, eos=None, max_model_len=512
    ):
        super().__init__(max_num_seqs, max_queue)
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.model = model
        self.reason = "transformers continuous batching (paged)"
        # Per-request temperature and top_p need the processors present: a non-default
        # value here creates them, each request then sets its own.
        config = GenerationConfig(
            do_sample=True, temperature=0.999, top_p=0.999, max_new_tokens=16, eos_token_id=eos
        )
        self.manager = model.init_continuous_batching(
            generation_config=config,
            # Pages for every slot at full length: left to itself, the manager sizes its
            # cache from the machine's free memory (12 GiB of a 24 GiB host, measured).
            continuous_batching_config=ContinuousBatchingConfig(
                max_requests_per_batch=max_num_seqs,
                per_request_processors=True,
                page_size=self.PAGE,
                num_blocks=max_num_seqs * (-(-max_model_len // self.PAGE) + 1),
            ),
        )
        self._live: dict[str, _Sequence] = {}
        self._count = 0

    @property
    def load(self) -> int:
        return len(self._live)

    def start(self) -> None:
        self.manager.start()

    def stop(self) -> None:
        self.manager.stop(block=True)

    def _submit(self, seq: _Sequence) -> None:
        self._count += 1
        rid = f"r{self._count}"
        seq.extra["id"] = rid
        self._live[rid] = seq
        p = seq.params

        def on_result(result) -> None:
            if result.error:
                seq.out.put_nowait(EngineStopped(result.error))
                return
            for t in result.generated_tokens[seq.generated :]:
                seq.generated += 1
                self.tokens_made += 1
                if t in p.stop_token_ids:
                    break
                seq.out.put_nowait(t)
            if result.is_finished() or seq.generated >= p.max_tokens:
                seq.out.put_nowait(_DONE)

        self.manager.register_result_handler(rid, on_result)
        kwargs = {}
        if p.temperature > 0:
            kwargs.update(temperature=float(p.temperature), top_p=float(p.top_p))
        else:
            kwargs.update(temperature=1e-5)
        self.manager.add_request(
            seq.prompt, request_id=rid, max_new_tokens=p.max_tokens, streaming=True, **kwargs
        )

    def _cancel(self, seq: _Sequence) -> None:
        rid = seq.extra.get("id")
        if self._live.pop(rid, None) is not None:
            self.manager.cancel_request(rid)


def vllm_available() -> str | None:
    """Why vLLM cannot serve here, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU for vLLM"
    return None


def choose_engine(requested: str = "auto") -> tuple[str, str]:
    """The engine to build and why, in words ``%deploy --list`` shows."""
    if requested not in ENGINES:
        raise ValueError(f"--engine {requested!r} is not one of {', '.join(ENGINES)}")
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    why_not_vllm = vllm_available()
    if requested in ("auto", "vllm") and why_not_vllm is None:
        return "vllm", "vLLM (continuous batching, paged KV cache)"
    if requested == "vllm":
        raise ValueError(f"--engine vllm cannot run here: {why_not_vllm}")
    if requested == "transformers-cb":
        return requested, f"transformers paged continuous batching ({device}; chosen by --engine)"
    return "step-batch", (
        f"transformers continuous batching ({device}; {why_not_vllm}; "
        "gpulab's step batcher, the fastest measured on CPU)"
    )


def build_engine(
    kind: str,
    model,
    *,
    max_num_seqs: int,
    max_queue: int,
    max_model_len: int,
    eos=None,
    max_admission_window_s: float = MAX_ADMISSION_WINDOW_S,
) -> Engine:
    if kind == "transformers-cb" and not getattr(model, "peft_config", None):
        return TransformersCBEngine(model, max_num_seqs, max_queue, eos, max_model_len)
    return StepBatchEngine(model, max_num_seqs, max_queue, max_admission_window_s)


def now() -> float:
    return time.perf_counter()
