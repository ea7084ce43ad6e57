"""The single-stream path: a request alone in the engine runs as plain `generate` runs it.

The continuous batch pays for its generality on every step (paged-cache reads and writes, batch
bookkeeping, routing outputs between threads). A request with the engine to itself runs instead as
the model's forward with a `DynamicCache`, one token a step, or with speculation (prompt lookup,
`speculation.py`, or a draft model, `draft_model.py`) the last token and up to `num_tokens` drafts
a step, the KV of rejected drafts
cropped away. When a second request is admitted, the lone one hands over at its next step: the
engine continues it in the batch, its prompt being the prompt plus what it has generated.

It runs on the batching thread itself (`submit`), between batches: the batch is empty while it
runs, and torch work never comes from two threads (a second thread's OpenMP team made the batch
25% slower at 32 concurrent requests, measured on 2 cores, long after the second thread went idle).

The path keeps the KV of the last request it ran and reuses the longest common prefix with the
next one (a conversation's earlier turns, a shared system prompt), when prefix caching is on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from switchyard.backends.embedded.draft_model import DraftModel, supports_cropping
from switchyard.backends.embedded.sampler import SamplingParams, TokenChoice
from switchyard.backends.embedded.speculation import PromptLookup, Speculation, verify, verify_sampled


@dataclass(slots=True)
class SoloCounts:
    num_requests: int = 0
    num_handovers: int = 0  # requests continued in the batch when another arrived
    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0  # drafts the target model chose itself
    num_reused_tokens: int = 0  # prompt tokens whose KV was kept from the previous request


@dataclass(slots=True)
class SoloRun:
    """One request on the single-stream path; the flags are set by the event loop, read by the thread."""

    prompt_ids: list[int]
    params: SamplingParams
    should_hand_over: Callable[[], bool]
    is_cancelled: bool = False
    is_handed_over: bool = False
    num_reused_tokens: int = 0  # prompt tokens whose KV the previous request left
    num_generated: int = 0
    generated_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Context:
    ids: list[int]  # the tokens whose KV `cache` holds
    cache: DynamicCache


class SoloPath:
    def __init__(
        self,
        model,
        stop_ids: Collection[int],
        speculation: Speculation,
        submit: Callable[[Callable[[], None]], None],
        *,
        reuses_prefix: bool = True,
        draft_model=None,
    ) -> None:
        self.model = model
        self.submit = submit  # runs a job on the batching thread
        self.stop_ids = frozenset(stop_ids)
        self.can_crop = supports_cropping(model.config)
        if speculation.method == "draft_model" and draft_model is None:
            speculation = Speculation(method="off")  # nothing to draft with
        self.speculation = speculation if self.can_crop else Speculation(method="off")
        self.drafter = (
            DraftModel(draft_model, speculation.num_tokens)
            if self.speculation.is_on and self.speculation.method == "draft_model"
            else None
        )
        self.reuses_prefix = reuses_prefix and self.can_crop
        self.counts = SoloCounts()
        self._context: _Context | None = None
        self._lock = threading.Lock()  # guards `_context` between a run ending and `close`

    def close(self) -> None:
        with self._lock:
            self._context = None
            if self.drafter is not None:
                self.drafter.reset()

    async def stream(self, run: SoloRun) -> AsyncGenerator[TokenChoice, None]:
        """The run's tokens, as the thread produces them. Ends early if the run hands over
        (`run.is_handed_over`); closing the iterator cancels the run at its next step."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[list[TokenChoice] | BaseException | None] = asyncio.Queue()

        def emit(item: list[TokenChoice] | BaseException | None) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        self.submit(lambda: self._run(run, emit))
        try:
            while (item := await outputs.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                for choice in item:
                    yield choice
        finally:
            run.is_cancelled = True

    # -- on the batching thread -----------------------------------------------------------------

    def _run(self, run: SoloRun, emit: Callable[[list[TokenChoice] | BaseException | None], None]) -> None:
        if run.is_cancelled:
            emit(None)
            return
        try:
            with torch.inference_mode():
                self._decode(run, emit)
        except Exception as exc:
            with self._lock:
                self._context = None  # its cache may be half-written
                if self.drafter is not None:
                    self.drafter.reset()
            emit(exc)
        else:
            emit(None)

    def _decode(self, run: SoloRun, emit: Callable[[list[TokenChoice]], None]) -> None:
        params, prompt_ids = run.params, run.prompt_ids
        self.counts.num_requests += 1
        cache, num_reused = self._take_context(prompt_ids)
        run.num_reused_tokens = num_reused
        self.counts.num_reused_tokens += num_reused
        uses_lookup = self.speculation.is_on and self.drafter is None
        lookup = PromptLookup(prompt_ids, self.speculation) if uses_lookup else None
        context_ids = list(prompt_ids)  # the cache holds all but the last of these
        pending = prompt_ids[num_reused:]
        draft: list[int] = []
        remaining = params.max_tokens
        while remaining > 0 and not run.is_cancelled:
            if run.num_generated and run.should_hand_over():
                run.is_handed_over = True
                self.counts.num_handovers += 1
                break
            draft, draft_probs = self._propose(lookup, context_ids, remaining - 1, run)
            logits = self._forward(pending + draft, cache, num_logits=len(draft) + 1)
            if draft_probs is None:
                choices = verify(logits, draft, params, self.stop_ids)
            else:
                choices = verify_sampled(logits, draft, draft_probs, params, self.stop_ids)
            num_rejected = len(draft) - (len(choices) - 1)
            if num_rejected:
                cache.crop(-num_rejected)
            self.counts.num_draft_tokens += len(draft)
            self.counts.num_accepted_tokens += len(choices) - 1
            token_ids = [choice.token_id for choice in choices]
            run.generated_ids.extend(token_ids)
            run.num_generated += len(token_ids)
            remaining -= len(token_ids)
            context_ids.extend(token_ids)
            if lookup is not None:
                lookup.extend(token_ids)
            emit(choices)
            if token_ids[-1] in self.stop_ids:
                break
            pending = token_ids[-1:]
        self._keep_context(context_ids[: cache.get_seq_length()], cache)

    def _propose(
        self, lookup: PromptLookup | None, context_ids: list[int], max_tokens: int, run: SoloRun
    ) -> tuple[list[int], list[torch.Tensor] | None]:
        """The drafts to verify with the next forward pass (none on the first, the prompt's), and
        the draft model's distributions when it sampled them."""
        if not run.num_generated:
            return [], None
        if lookup is not None:
            return lookup.propose(max_tokens), None
        if self.drafter is not None:
            return self.drafter.propose(context_ids, max_tokens, run.params)
        return [], None

    def _forward(self, input_ids: list[int], cache: DynamicCache, num_logits: int) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([input_ids]), past_key_values=cache, use_cache=True, logits_to_keep=num_logits
        )
        return out.logits[0].float()

    def _take_context(self, prompt_ids: list[int]) -> tuple[DynamicCache, int]:
        """A cache holding the longest prefix of the prompt the last request left (never all of
        it: the last prompt token is computed for the first logits), and that prefix's length."""
        with self._lock:
            context, self._context = self._context, None
        if context is not None and self.reuses_prefix:
            limit = min(len(context.ids), len(prompt_ids) - 1)
            num_common = next((i for i in range(limit) if context.ids[i] != prompt_ids[i]), limit)
            if num_common:
                context.cache.crop(num_common - len(context.ids))
                return context.cache, num_common
        return DynamicCache(config=self.model.config), 0

    def _keep_context(self, ids: list[int], cache: DynamicCache) -> None:
        if self.reuses_prefix and len(ids) == cache.get_seq_length():
            with self._lock:
                self._context = _Context(ids, cache)
