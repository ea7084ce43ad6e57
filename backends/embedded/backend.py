"""The `embedded` backend kind: a model running in this process on the embedded engine."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.base import AnyRequest, Backend, BackendHealth, answered_by
from switchyard.backends.embedded import openai_format as fmt
from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits
from switchyard.core.errors import BackendUnavailable
from switchyard.core.protocol import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.urls import replica_label

logger = logging.getLogger("switchyard.engine")


class EmbeddedBackend(Backend):
    starts_in_background = True

    def __init__(
        self,
        name: str,
        model: str,
        limits: EngineLimits | None = None,
        *,
        default_max_tokens: int = 256,
        num_threads: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.model_spec = model
        self.limits = limits or EngineLimits()
        self.default_max_tokens = default_max_tokens
        self._num_threads = num_threads
        self._cache_dir = cache_dir
        self.engine: EmbeddedEngine | None = None
        self._load_error: str | None = None
        self.label = replica_label("embedded", 0)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start the engine, off the event loop. Failures are reported by health()."""
        from switchyard.backends.embedded.models import load_model

        try:
            model, tokenizer = await asyncio.to_thread(
                load_model, self.model_spec, cache_dir=self._cache_dir, num_threads=self._num_threads
            )
            engine = EmbeddedEngine(model, tokenizer, self.limits, name=self.name)
            await asyncio.to_thread(engine.start)
        except Exception as exc:
            self._load_error = f"{type(exc).__name__}: {exc}"
            logger.error("model %s (%s) failed to load: %s", self.name, self.model_spec, self._load_error)
            return
        self.engine = engine
        logger.info("model %s (%s) is ready", self.name, self.model_spec)

    async def aclose(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.stop)

    def is_ready(self) -> bool:
        return self.engine is not None and self.engine.is_running

    def is_saturated(self) -> bool:
        """Requests are waiting for KV blocks: a new one would queue behind them."""
        return self.engine is not None and self.engine.num_waiting > 0

    async def health(self) -> BackendHealth:
        if self.is_ready():
            assert self.engine is not None
            used = self.engine.num_reserved_blocks / self.engine.num_total_blocks
            return BackendHealth(True, f"running; KV blocks reserved {used:.0%}; waiting {self.engine.num_waiting}")
        return BackendHealth(False, self._load_error or "loading")

    def _engine(self) -> EmbeddedEngine:
        if self.engine is None:
            detail = self._load_error or "the model is still loading"
            raise BackendUnavailable(f"{self.name} is not ready: {detail}", backend=self.name, retry_after_s=5)
        answered_by.set(self.label)
        return self.engine

    # -- requests -------------------------------------------------------------------------------

    def _prepare(self, request: AnyRequest):
        engine = self._engine()
        tokenizer = engine.tokenizer
        is_chat = isinstance(request, ChatCompletionRequest)
        prompt_ids = (
            fmt.chat_prompt_ids(tokenizer, request) if is_chat else fmt.completion_prompt_ids(tokenizer, request)
        )
        params = fmt.sampling_params(request, len(prompt_ids), engine.limits.context_window, self.default_max_tokens)
        if is_chat and not getattr(tokenizer, "chat_template", None) and len(params.stop) < 4:
            # A base model answering a plain transcript would go on to write the user's next turn.
            params.stop = (*params.stop, fmt.FALLBACK_TURN_STOP)
        return engine, tokenizer, is_chat, prompt_ids, params

    async def complete(self, request: AnyRequest) -> CompletionResult:
        assembler = AnswerAssembler(self.name)
        async for chunk in self.stream(request):
            assembler.add(chunk)
        return assembler.result()

    async def stream(self, request: AnyRequest) -> AsyncIterator[StreamChunk]:
        engine, tokenizer, is_chat, prompt_ids, params = self._prepare(request)
        base = {
            "id": ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion.chunk" if is_chat else "text_completion",
            "created": fmt.now(),
            "model": self.name,
        }
        wants_logprobs = bool(request.logprobs) if is_chat else request.logprobs is not None
        assembler = fmt.TextAssembler(tokenizer, params.stop)
        steps = engine.generate(prompt_ids, params)
        num_generated, finish_reason, offset = 0, "length", 0
        try:
            if is_chat:
                yield self._chunk(base, {"role": "assistant", "content": ""}, None, None, is_chat)
            async for step in steps:
                num_generated += 1
                if step.token_id in engine.eos_token_ids:
                    finish_reason = "stop"
                    break
                text = assembler.add(step.token_id)
                logprobs = None
                if wants_logprobs and not assembler.is_stopped:
                    if is_chat:
                        logprobs = {
                            "content": [fmt.chat_logprob_entry(tokenizer, step.token_id, step.logprob, step.top)]
                        }
                    else:
                        logprobs = fmt.completion_logprobs(tokenizer, [(step.token_id, step.logprob, step.top)], offset)
                offset += len(text)
                if text or logprobs:
                    yield self._chunk(base, {"content": text} if is_chat else text, logprobs, None, is_chat)
                if assembler.is_stopped:
                    finish_reason = "stop"
                    break
        finally:
            await steps.aclose()
        rest = assembler.flush()
        yield self._chunk(base, ({"content": rest} if rest else {}) if is_chat else rest, None, finish_reason, is_chat)
        yield StreamChunk.from_dict({**base, "choices": [], "usage": fmt.usage(len(prompt_ids), num_generated)})

    @staticmethod
    def _chunk(base: dict, delta: Any, logprobs: Any, finish_reason: str | None, is_chat: bool) -> StreamChunk:
        choice: dict[str, Any] = {"index": 0}
        if is_chat:
            choice["delta"] = delta
        else:
            choice["text"] = delta
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        return StreamChunk.from_dict({**base, "choices": [choice]})
