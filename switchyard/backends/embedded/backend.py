"""The `embedded` backend kind: a model running in this process on the embedded engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.base import AnyRequest, Backend, BackendHealth, Pick
from switchyard.backends.embedded import openai_format as fmt
from switchyard.backends.embedded import tool_calls
from switchyard.backends.embedded.constraints import JsonGrammar
from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits
from switchyard.backends.embedded.models import shown_load_failure
from switchyard.backends.embedded.prefix_cache import PrefixCacheCounts, PrefixCacheStats
from switchyard.backends.token_counts import OFF_LOOP_TOKEN_IDS, TokenCount, run_counter
from switchyard.core.capabilities import Capabilities, needs, unsupported
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import BackendUnavailable, InvalidRequest, wrong_kind
from switchyard.core.requests import GenerationRequest
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
        self._grammar: JsonGrammar | None = None
        self._load_error: str | None = None
        self._load_failure: str | None = None  # what /health/ready shows of it
        self.label = replica_label("embedded", 0)
        self.prefix_cache_counts = PrefixCacheCounts()  # this model's, whichever engine ran it

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start the engine, off the event loop. Failures are reported by health()."""
        from switchyard.backends.embedded.models import load_model

        try:
            model, tokenizer = await asyncio.to_thread(
                load_model, self.model_spec, cache_dir=self._cache_dir, num_threads=self._num_threads
            )
            draft_model = await self._load_draft_model(model, tokenizer)
            engine = EmbeddedEngine(
                model, tokenizer, self.limits, name=self.name, draft_model=draft_model, num_threads=self._num_threads
            )
            await asyncio.to_thread(engine.start)
        except Exception as exc:
            self._load_error = f"{type(exc).__name__}: {exc}"
            self._load_failure = shown_load_failure(exc)
            logger.error("model %s (%s) failed to load: %s", self.name, self.model_spec, self._load_error)
            return
        self.engine = engine
        self._grammar = JsonGrammar(tokenizer)
        logger.info("model %s (%s) is ready", self.name, self.model_spec)

    async def _load_draft_model(self, model, tokenizer):
        """The draft model speculation is configured with, checked against the target; else None."""
        speculation = self.limits.speculation
        if speculation.method != "draft_model" or not speculation.draft_model or not self.limits.single_stream:
            return None
        from switchyard.backends.embedded.draft_model import check_draft_model
        from switchyard.backends.embedded.models import load_model

        draft_model, draft_tokenizer = await asyncio.to_thread(
            load_model, speculation.draft_model, cache_dir=self._cache_dir, num_threads=self._num_threads
        )
        check_draft_model(draft_model, draft_tokenizer, model, tokenizer)
        logger.info("model %s drafts with %s", self.name, speculation.draft_model)
        return draft_model

    async def aclose(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.stop)

    def load_failure(self) -> str | None:
        return self._load_failure

    def is_ready(self) -> bool:
        return self.engine is not None and self.engine.is_running

    def is_saturated(self) -> bool:
        """Requests are waiting for KV blocks: a new one would queue behind them."""
        return self.engine is not None and self.engine.num_waiting > 0

    def queued_tokens(self) -> int:
        """Tokens (prompt plus max_tokens) of the requests waiting for KV blocks."""
        return self.engine.num_waiting_tokens if self.engine is not None else 0

    def draft_counts(self) -> tuple[int, int]:
        """Speculation's draft tokens verified so far, and those the model accepted."""
        counts = self.engine.solo_counts if self.engine is not None else None
        return (counts.num_draft_tokens, counts.num_accepted_tokens) if counts is not None else (0, 0)

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Prompt tokens looked up in the prefix cache and found there, and what it holds now; None
        with `prefix_caching: false` or a model that cannot share blocks (sliding-window layers)."""
        engine, counts = self._loaded_engine(), self.prefix_cache_counts
        if not self.limits.prefix_caching or (engine is not None and not engine.uses_prefix_caching):
            return None
        num_cached = engine.num_prefix_cached_tokens if engine is not None else 0
        return PrefixCacheStats(counts.num_query_tokens, counts.num_hit_tokens, num_cached)

    def _loaded_engine(self) -> EmbeddedEngine | None:
        return self.engine

    async def health(self) -> BackendHealth:
        if self.is_ready():
            assert self.engine is not None
            used = self.engine.num_reserved_blocks / self.engine.num_total_blocks
            return BackendHealth(True, f"running; KV blocks reserved {used:.0%}; waiting {self.engine.num_waiting}")
        return BackendHealth(False, self._load_error or "loading")

    def capabilities(self) -> Capabilities:
        """What the engine really does. Tools only when the loaded model's chat template renders them
        (until it is loaded: no tools), one call per answer, one choice per request, no images."""
        tools = self.engine is not None and tool_calls.renders_tools(self.engine.tokenizer)
        return Capabilities(
            tools=tools,
            parallel_tool_calls=False,
            json_object=True,
            json_schema=True,
            vision=False,
            documents=False,
            logprobs=True,
            n=False,
            context_window=self.limits.context_window,
        )

    def _refuse_what_it_cannot_do(self, request: AnyRequest) -> None:
        """The same check routing makes, here too: a request that reaches this backend anyway gets a
        400, never an answer that ignored part of it."""
        lacking = self.capabilities().lacks(needs(request))
        if lacking:
            raise unsupported(self.name, lacking)

    def _engine(self) -> EmbeddedEngine:
        if self.engine is None:
            detail = self._load_error or "the model is still loading"
            raise BackendUnavailable(f"{self.name} is not ready: {detail}", backend=self.name, retry_after_s=5)
        return self.engine

    @contextlib.asynccontextmanager
    async def _serving_engine(self) -> AsyncIterator[EmbeddedEngine]:
        """The engine a request runs on, held for as long as the request runs."""
        yield self._engine()

    def _json_grammar(self) -> JsonGrammar:
        assert self._grammar is not None
        return self._grammar

    # -- tokens ---------------------------------------------------------------------------------

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """The prompt ids the engine is given for `request` (the chat template over the messages, or
        the prompt): `count` is what the answer's `usage.prompt_tokens` says."""
        tokenizer = self._engine().tokenizer
        if isinstance(request, ChatCompletionRequest):
            ids = await run_counter(lambda: fmt.chat_prompt_ids(tokenizer, request), request)
        else:
            ids = await run_counter(lambda: fmt.completion_prompt_ids(tokenizer, request), request)
        return TokenCount(len(ids), list(ids), max_model_len=self.limits.context_window)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`, special tokens included (as vLLM's /detokenize writes them)."""
        tokenizer = self._engine().tokenizer
        vocabulary = len(tokenizer)
        unknown = next((t for t in tokens if not 0 <= t < vocabulary), None)
        if unknown is not None:
            raise InvalidRequest(
                f"Token id {unknown} is not in the vocabulary of '{self.name}' ({vocabulary} tokens).", param="tokens"
            )
        if len(tokens) < OFF_LOOP_TOKEN_IDS:
            return tokenizer.decode(list(tokens), skip_special_tokens=False)
        return await asyncio.to_thread(tokenizer.decode, list(tokens), skip_special_tokens=False)

    # -- requests -------------------------------------------------------------------------------

    async def _prepare(self, engine: EmbeddedEngine, request: GenerationRequest):
        self._refuse_what_it_cannot_do(request)
        tokenizer = engine.tokenizer
        is_chat = isinstance(request, ChatCompletionRequest)
        if isinstance(request, ChatCompletionRequest):
            prompt_ids = fmt.chat_prompt_ids(tokenizer, request)
        else:
            prompt_ids = fmt.completion_prompt_ids(tokenizer, request)
        params = fmt.sampling_params(request, len(prompt_ids), engine.limits.context_window, self.default_max_tokens)
        if is_chat and not getattr(tokenizer, "chat_template", None) and len(params.stop) < 4:
            # A base model answering a plain transcript would go on to write the user's next turn.
            params.stop = (*params.stop, fmt.FALLBACK_TURN_STOP)
        if isinstance(request, ChatCompletionRequest):
            params.constraint = await self._constraint(request)
        return tokenizer, is_chat, prompt_ids, params

    async def _constraint(self, request: ChatCompletionRequest):
        """The JSON grammar the answer is decoded under: a forced tool call's, else response_format's."""
        schema = tool_calls.call_schema(request) if tool_calls.uses_tools(request) else None
        param = "tool_choice"
        if schema is None:
            is_json, schema = fmt.response_schema(request)
            param = "response_format"
            if not is_json:
                return None
        grammar = self._json_grammar()
        if not grammar.is_prepared:
            await asyncio.to_thread(grammar.prepare)
        try:
            return grammar.constraint(schema)
        except Exception as exc:  # the schema parser's own errors: a schema it cannot follow
            raise InvalidRequest(f"{self.name} cannot follow this JSON schema: {exc}", param=param) from exc

    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult:
        assembler = AnswerAssembler(self.name)
        async for chunk in self.stream(request):
            assembler.add(chunk)
        return assembler.result()

    async def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]:
        if isinstance(request, EmbeddingRequest):  # routing sends embeddings to embedding models only
            raise wrong_kind(self.name, "chat")
        async with self._serving_engine() as engine, contextlib.aclosing(self._answer(engine, request)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _answer(self, engine: EmbeddedEngine, request: GenerationRequest) -> AsyncGenerator[StreamChunk, None]:
        tokenizer, is_chat, prompt_ids, params = await self._prepare(engine, request)
        base = {
            "id": ("chatcmpl-" if is_chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion.chunk" if is_chat else "text_completion",
            "created": fmt.now(),
            "model": self.name,
        }
        wants_logprobs = bool(request.logprobs) if is_chat else request.logprobs is not None
        # An answer that may be a tool call is held back until it is whole: only then is it known
        # whether it is a call (sent as tool_calls) or text.
        tools_request = (
            request if isinstance(request, ChatCompletionRequest) and tool_calls.uses_tools(request) else None
        )
        holds_back = tools_request is not None
        held_text: list[str] = []
        held_logprobs: list[dict] = []
        assembler = fmt.TextAssembler(tokenizer, params.stop)
        steps = engine.generate(prompt_ids, params)
        num_generated, num_cached, finish_reason, offset = 0, 0, "length", 0
        try:
            if is_chat:
                head = {"role": "assistant"} if holds_back else {"role": "assistant", "content": ""}
                yield self._chunk(base, head, None, None, is_chat)
            async for step in steps:
                num_generated += 1
                if num_generated == 1:  # the prompt is in: whatever came from the prefix cache is known
                    num_cached = step.num_cached_tokens
                    if engine.uses_prefix_caching:
                        self.prefix_cache_counts.add(len(prompt_ids), num_cached)
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
                if holds_back:
                    held_text.append(text)
                    held_logprobs += logprobs["content"] if logprobs else []
                elif text or logprobs:
                    yield self._chunk(base, {"content": text} if is_chat else text, logprobs, None, is_chat)
                if assembler.is_stopped:
                    finish_reason = "stop"
                    break
        finally:
            await steps.aclose()
        rest = assembler.flush()
        if tools_request is not None:
            text = "".join(held_text) + rest
            logprobs = {"content": held_logprobs} if wants_logprobs else None
            calls = tool_calls.parse_tool_calls(text, tools_request) if finish_reason == "stop" else []
            if calls:
                for index, call in enumerate(calls):
                    yield self._chunk(base, _call_delta(index, call), logprobs if index == 0 else None, None, True)
                finish_reason = "tool_calls"
            elif text or logprobs:
                yield self._chunk(base, {"content": text}, logprobs, None, True)
            rest = ""
        yield self._chunk(base, ({"content": rest} if rest else {}) if is_chat else rest, None, finish_reason, is_chat)
        usage = fmt.usage(len(prompt_ids), num_generated, num_cached)
        yield StreamChunk.from_dict({**base, "choices": [], "usage": usage})

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


def _call_delta(index: int, call: dict[str, Any]) -> dict[str, Any]:
    """One whole call as a stream delta: id, name and arguments at once (OpenAI may split the arguments
    over several deltas; clients join them either way)."""
    return {"tool_calls": [{"index": index, **call}]}
