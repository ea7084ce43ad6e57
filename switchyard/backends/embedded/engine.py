"""The embedded engine: transformers' continuous batching with paged attention, on CPU.

One background thread runs the batch (transformers' `ContinuousBatchingManager`); the event loop
only enqueues requests and receives tokens through `call_soon_threadsafe`, so no model work ever
runs on it. Admission is counted in the engine's own currency, KV-cache blocks: a request reserves
the blocks its prompt plus `max_tokens` can fill, waits in a bounded queue when they are taken, and
gives them back the moment it finishes or is cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import queue
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace

import torch
from transformers import GenerationConfig
from transformers.generation import ContinuousBatchingConfig
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs

from switchyard.backends.embedded import decode_attention, prefix_cache
from switchyard.backends.embedded.sampler import SamplingParams, TokenChoice, choose_tokens
from switchyard.backends.embedded.solo import SoloCounts, SoloPath, SoloRun
from switchyard.backends.embedded.speculation import Speculation
from switchyard.backends.embedded.threads import use_threads
from switchyard.core.errors import BackendError, BackendUnavailable, ContextLengthExceeded

logger = logging.getLogger("switchyard.engine")


@dataclass(frozen=True, slots=True)
class EngineLimits:
    page_size: int = 32  # tokens per KV block
    num_blocks: int = 256  # KV blocks in the cache
    max_batch_tokens: int = 512  # tokens in one forward pass (prefill chunks + decodes)
    max_queue: int = 64  # requests allowed to wait for blocks; beyond it, 503
    queue_timeout_s: float = 30.0  # longest wait for blocks before a 503
    context_window: int = 2048  # prompt + max_tokens may not exceed it
    prefix_caching: bool = True  # reuse the KV blocks of earlier prompts' prefixes (see `prefix_cache.py`)
    single_stream: bool = True  # a request alone runs on the single-stream path (see `solo.py`)
    speculation: Speculation = Speculation()  # drafts verified per step on that path (see `speculation.py`)


@dataclass(slots=True)
class TokenStep:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (the request's, every step)


class _Manager(ContinuousBatchingManager):
    """The transformers manager with our sampler in place of its own (see `sampler.py`)."""

    def __init__(self, *args, engine: EmbeddedEngine, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._engine = engine
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()  # single-stream runs

    def run_soon(self, job: Callable[[], None]) -> None:
        """Run `job` on the batching thread before its next batch (see `solo.py`)."""
        self._jobs.put(job)
        self._wake_up_loop.set()

    def run_pending_jobs(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            job()

    def _generation_loop_body(self, batch_processor, bootstrapping: bool) -> bool:
        self.run_pending_jobs()
        return super()._generation_loop_body(batch_processor, bootstrapping)

    def _create_batch_processor(self):
        processor = super()._create_batch_processor()
        runner = processor.model_runner
        ios = processor.inputs_and_outputs
        assert isinstance(ios, ContinuousBatchingIOs)  # the engine turns async batching off
        engine = self._engine

        def sample(scores: torch.Tensor, output_ids: torch.Tensor) -> None:
            rows = [future.state for future in ios.requests_in_batch if future.has_new_token]
            logits = scores[0]
            params = [engine.params_of(state.request_id) for state in rows[: logits.shape[0]]]
            params += [SamplingParams(temperature=0.0)] * (logits.shape[0] - len(params))
            choices = choose_tokens(logits, params)
            n = len(choices)
            output_ids[0, :n].copy_(torch.tensor([c.token_id for c in choices], dtype=output_ids.dtype))
            if runner.return_logprobs:
                lps = torch.tensor([c.logprob for c in choices], dtype=torch.float32)
                output_ids[1, :n].copy_(lps.view(dtype=torch.int32))
            for state, choice in zip(rows, choices, strict=False):
                engine.record_choice(state.request_id, choice)

        runner._sample = sample  # type: ignore[method-assign]  # our sampler in place of transformers'
        prefix_cache.install(processor.cache, engine.record_prefix_match)
        return processor


class EmbeddedEngine:
    def __init__(
        self,
        model,
        tokenizer,
        limits: EngineLimits = EngineLimits(),
        *,
        name: str = "embedded",
        draft_model=None,
        num_threads: int | None = None,
    ) -> None:
        self.name = name
        self.num_threads = num_threads  # torch intra-op threads of the batching thread (None: every core)
        self.model = model
        self.draft_model = draft_model  # drafts for the single-stream path (speculation method draft_model)
        self.tokenizer = tokenizer
        self.limits = limits
        eos = tokenizer.eos_token_id
        self.eos_token_ids = {eos} if isinstance(eos, int) else set(eos or ())
        self._params: dict[str, SamplingParams] = {}
        self._tops: dict[str, list[list[tuple[int, float]]]] = {}
        self._num_cached: dict[str, int] = {}  # request id -> prompt tokens found in the prefix cache
        self.uses_prefix_caching = limits.prefix_caching and prefix_cache.supports_prefix_caching(model.config)
        self._ids = itertools.count()
        self._num_reserved_blocks = 0
        self._num_waiting = 0
        self._num_waiting_tokens = 0  # the prompt plus max_tokens of each request waiting for blocks
        self._blocks_freed = asyncio.Event()  # set (and replaced) whenever blocks are given back
        self._manager: _Manager | None = None
        self._solo: SoloPath | None = None
        self._solo_run: SoloRun | None = None  # the request on the single-stream path, if one is

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching thread (blocking; call it off the event loop)."""
        generation_config = GenerationConfig(
            do_sample=False,
            max_new_tokens=self.limits.context_window,
            eos_token_id=list(self.eos_token_ids) or -1,
            pad_token_id=self.tokenizer.pad_token_id or next(iter(self.eos_token_ids), 0),
        )
        cb_config = ContinuousBatchingConfig(
            return_logprobs=True,
            page_size=self.limits.page_size,
            num_blocks=self.limits.num_blocks,
            max_batch_tokens=self.limits.max_batch_tokens,
            allow_block_sharing=self.uses_prefix_caching,
            use_async_batching=False,
            # transformers admits every request and keeps a free-block margin against its own overcommit,
            # evicting the whole prefix cache whenever the margin is crossed. Our admission (`_reserve`)
            # never overcommits, so no margin: cached blocks are evicted one at a time, when needed.
            safety_margin=0.0,
        )
        decode_attention.install()  # before the manager picks its attention function
        self._manager = _Manager(self.model, generation_config, cb_config, engine=self)
        self._manager.run_soon(lambda: use_threads(self.num_threads))  # before its first batch
        self._manager.start()
        if self.limits.single_stream:
            self._solo = SoloPath(
                self.model,
                self.eos_token_ids,
                self.limits.speculation,
                self._manager.run_soon,
                reuses_prefix=self.limits.prefix_caching,
                draft_model=self.draft_model,
            )

    def stop(self) -> None:
        if self._solo_run is not None:
            self._solo_run.is_cancelled = True
        if self._manager is not None:
            self._manager.stop(block=True, timeout=10)
            self._manager.run_pending_jobs()  # cancelled: each only tells its stream that it ended
            self._manager = None
        if self._solo is not None:
            self._solo.close()
            self._solo = None

    @property
    def is_running(self) -> bool:
        return self._manager is not None and self._manager.is_running()

    # -- called from the batching thread -------------------------------------------------------

    def params_of(self, request_id: str) -> SamplingParams:
        return self._params.get(request_id) or SamplingParams(temperature=0.0)

    def record_choice(self, request_id: str, choice: TokenChoice) -> None:
        tops = self._tops.get(request_id)
        if tops is not None:
            tops.append(choice.top)

    def record_prefix_match(self, request_id: str, num_tokens: int) -> None:
        if request_id in self._params:  # not one that has just left
            self._num_cached[request_id] = num_tokens

    # -- prefix cache ---------------------------------------------------------------------------

    @property
    def num_prefix_cached_tokens(self) -> int:
        """Tokens whose KV the prefix cache holds now (in use or kept for reuse); 0 without it."""
        processor = self._manager.batch_processor if self._manager is not None else None
        if not self.uses_prefix_caching or processor is None:
            return 0
        return prefix_cache.num_cached_tokens(processor.cache)

    @property
    def solo_counts(self) -> SoloCounts | None:
        """What the single-stream path has done (speculation's drafts among it); None when it is off."""
        return self._solo.counts if self._solo is not None else None

    # -- admission ------------------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        return self.limits.num_blocks

    @property
    def num_reserved_blocks(self) -> int:
        return self._num_reserved_blocks

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_waiting_tokens(self) -> int:
        return self._num_waiting_tokens

    def blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.limits.page_size)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        window = self.limits.context_window
        if num_prompt_tokens + max_tokens > window:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                param="messages",
            )
        if self.blocks_for(num_prompt_tokens + max_tokens) > self.num_total_blocks:
            capacity = self.num_total_blocks * self.limits.page_size
            raise ContextLengthExceeded(
                f"The request needs {num_prompt_tokens + max_tokens} tokens of KV cache; this engine holds "
                f"{capacity}. Please reduce the length of the messages or completion.",
                param="messages",
            )

    async def _reserve(self, num_blocks: int, num_tokens: int = 0) -> None:
        fits = lambda: self._num_reserved_blocks + num_blocks <= self.num_total_blocks  # noqa: E731
        if not fits():
            if self._num_waiting >= self.limits.max_queue:
                raise BackendUnavailable(
                    f"{self.name} is saturated: {self._num_waiting} requests are already waiting for KV cache",
                    backend=self.name,
                    retry_after_s=1,
                )
            self._num_waiting += 1
            self._num_waiting_tokens += num_tokens
            try:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.limits.queue_timeout_s
                while not fits():
                    try:
                        await asyncio.wait_for(self._blocks_freed.wait(), max(0.0, deadline - loop.time()))
                    except TimeoutError:
                        raise BackendUnavailable(
                            f"{self.name} is saturated: no KV cache freed within {self.limits.queue_timeout_s:g} s",
                            backend=self.name,
                            retry_after_s=1,
                        ) from None
            finally:
                self._num_waiting -= 1
                self._num_waiting_tokens -= num_tokens
        self._num_reserved_blocks += num_blocks

    def _release(self, num_blocks: int) -> None:
        """Synchronous, so it also runs in a `finally` that a cancellation is passing through."""
        self._num_reserved_blocks -= num_blocks
        freed, self._blocks_freed = self._blocks_freed, asyncio.Event()
        freed.set()

    # -- generation -----------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncGenerator[TokenStep, None]:
        """Yield each generated token (EOS included, as the last) with its logprob and alternatives.

        A request alone in the engine runs on the single-stream path until another is admitted,
        then continues in the batch. Closing the iterator early (the client left, a stop string
        matched) cancels the request and gives its KV blocks back.
        """
        if self._solo is None or self._manager is None or not self._is_idle():
            async for step in self._generate_in_batch(prompt_ids, params):
                yield step
            return
        self.check_fits(len(prompt_ids), params.max_tokens)
        num_blocks = self.blocks_for(len(prompt_ids) + params.max_tokens)
        await self._reserve(num_blocks, len(prompt_ids) + params.max_tokens)
        run = SoloRun(prompt_ids, params, should_hand_over=lambda: not self._is_idle(ignoring_solo=True))
        self._solo_run = run
        try:
            async for choice in self._solo.stream(run):
                yield TokenStep(choice.token_id, choice.logprob, choice.top, run.num_reused_tokens)
        finally:
            self._solo_run = None
            self._release(num_blocks)
        if run.is_handed_over:
            rest = replace(params, max_tokens=params.max_tokens - run.num_generated)
            rest.generator = params.generator  # the same draws continue, not the seed's first ones again
            async for step in self._generate_in_batch(prompt_ids + run.generated_ids, rest):
                yield step

    def _is_idle(self, *, ignoring_solo: bool = False) -> bool:
        """No request in the batch, none waiting for blocks, and (unless ignored) none running alone."""
        return not self._params and not self._num_waiting and (ignoring_solo or self._solo_run is None)

    async def _generate_in_batch(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenStep, None]:
        if self._manager is None:
            raise BackendUnavailable(f"{self.name} is not started", backend=self.name, retry_after_s=5)
        self.check_fits(len(prompt_ids), params.max_tokens)
        num_tokens = len(prompt_ids) + params.max_tokens
        # Reserved in full even when a prefix will come from the cache: a shared block counts for every
        # request holding it (more than it takes, never less), and a block kept only for reuse counts for
        # none, since it is evicted the moment an allocation needs it. So what is admitted always fits,
        # and no request ever waits on blocks that only the cache holds.
        num_blocks = self.blocks_for(num_tokens)
        await self._reserve(num_blocks, num_tokens)
        request_id = f"{self.name}-{next(self._ids)}"
        outputs: asyncio.Queue = asyncio.Queue()
        self._params[request_id] = params
        self._tops[request_id] = []
        is_finished = False
        manager = self._manager
        try:
            manager.register_result_handler(request_id, outputs.put_nowait)
            # Our admission bounds what is in flight, so this put never blocks.
            if (
                manager.add_request(prompt_ids, request_id=request_id, max_new_tokens=params.max_tokens, streaming=True)
                is None
            ):
                raise BackendUnavailable(f"{self.name} refused the request (stopping?)", backend=self.name)
            num_sent = 0
            while not is_finished:
                output = await outputs.get()
                if output.error:
                    raise BackendError(f"{self.name} failed: {output.error}", backend=self.name)
                tops = self._tops[request_id]
                for i in range(num_sent, len(output.generated_tokens)):
                    top = tops[i] if i < len(tops) else []
                    num_cached = self._num_cached.get(request_id, 0)
                    yield TokenStep(output.generated_tokens[i], output.logprobs[i], top, num_cached)
                num_sent = len(output.generated_tokens)
                is_finished = output.is_finished()
        finally:
            if not is_finished:
                manager.cancel_request(request_id)
            with manager.output_router._lock:
                manager.output_router.result_handlers.pop(request_id, None)
            self._params.pop(request_id, None)
            self._tops.pop(request_id, None)
            self._num_cached.pop(request_id, None)
            self._release(num_blocks)
