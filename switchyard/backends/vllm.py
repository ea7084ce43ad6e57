"""vLLM: the OpenAI-compatible HTTP backend plus what vLLM's servers tell about their load.

Every few seconds each replica's Prometheus `/metrics` is read (`vllm:num_requests_waiting`,
`vllm:num_requests_running`, KV-cache usage). A request then goes to:

1. if it has a system prompt: the replica that rendezvous hashing assigns to that prompt, so the
   replica's prefix cache keeps serving it — unless that replica is saturated or down;
2. otherwise (or when the sticky replica is saturated): the least-loaded ready replica, counting
   the last scrape plus what we sent since.

A replica is saturated when its waiting queue or its KV-cache usage passes the configured limits;
`is_saturated()` (every ready replica saturated) is the signal routing uses to degrade or queue.

A LoRA adapter (`adapter()`) is served by the same replicas under its own name: its requests go to
the least-loaded replica that holds it, else it is loaded on the least-loaded one
(`switchyard.backends.vllm_adapters`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from switchyard.backends.base import AnyRequest, Backend, BackendHealth, Pick, StreamProgress
from switchyard.backends.breaker import Breaker
from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.backends.token_counts import TokenCount
from switchyard.backends.vllm_adapters import LoRAAdapters, listed_adapters
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.errors import BackendError, BackendRejected
from switchyard.core.requests import GenerationRequest
from switchyard.core.supervision import SupervisedTask

logger = logging.getLogger("switchyard.vllm")

KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets (prometheus_client's parser); non-finite values
    are skipped. A text the parser rejects is read again line by line, skipping the bad lines."""
    values: dict[str, float] = {}
    try:
        _add_samples(values, text)
    except ValueError:
        values.clear()
        for line in text.splitlines():
            if line and not line.startswith("#"):
                with contextlib.suppress(ValueError):
                    _add_samples(values, line)
    return values


def _add_samples(values: dict[str, float], text: str) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isfinite(sample.value):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value


@dataclass(eq=False, slots=True)
class VLLMReplica(Replica):
    KIND = "vllm"

    num_waiting: float = 0.0
    num_running: float = 0.0
    kv_cache_usage: float = 0.0
    num_sent_since_scrape: int = 0
    has_metrics: bool = False
    is_saturated: bool = False

    @property
    def metrics_url(self) -> str:
        return self.base_url.removesuffix("/v1") + "/metrics"

    @property
    def load(self) -> float:
        return self.num_waiting + self.num_running + self.num_sent_since_scrape


@dataclass(frozen=True, slots=True)
class SaturationLimits:
    max_waiting: int = 4
    max_kv_cache_usage: float = 0.9


def _prefix_key(request: AnyRequest) -> str | None:
    if isinstance(request, ChatCompletionRequest):
        first = request.messages[0]
        if first.role in ("system", "developer") and first.content:
            return first.content if isinstance(first.content, str) else str(first.content)
    return None


def _rendezvous_score(key: str, replica: Replica) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica.base_url}".encode(), digest_size=8).digest(), "big")


class VLLMBackend(OpenAIHTTPBackend):
    starts_in_background = True

    replicas: list[VLLMReplica]  # type: ignore[assignment]  # built by this class: only its own kind

    def __init__(
        self,
        *args,
        metrics_interval_s: float = 2.0,
        limits: SaturationLimits | None = None,
        is_sticky: bool = True,
        max_loras: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.metrics_interval_s = metrics_interval_s
        self.limits = limits or SaturationLimits()
        self.is_sticky = is_sticky
        self.lora = LoRAAdapters(self.name, self._session, max_loras=max_loras, timeout=self._timeout)
        self._scraper: SupervisedTask | None = None

    # -- load signal ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._scraper = SupervisedTask(f"vllm-metrics:{self.name}", self._scrape_forever)
        self._scraper.start()
        await self.scrape()

    def background_tasks(self) -> Sequence[SupervisedTask]:
        return () if self._scraper is None else (self._scraper,)

    async def _scrape_forever(self) -> None:
        while True:
            await asyncio.sleep(self.metrics_interval_s)
            await self.scrape()

    async def scrape(self) -> None:
        listings = [self._list_adapters(replica) for replica in self.replicas] if self.lora.names else []
        await asyncio.gather(*(self._scrape(replica) for replica in self.replicas), *listings)

    async def _scrape(self, replica: VLLMReplica) -> None:
        try:
            async with self._session.get(
                replica.metrics_url, headers=replica.headers, timeout=self._health_timeout
            ) as response:
                if response.status != 200:
                    replica.has_metrics = False
                    return
                metrics = parse_prometheus(await response.text())
        except (TimeoutError, aiohttp.ClientError, ValueError):  # ValueError: not text (UnicodeDecodeError)
            replica.has_metrics = False
            return
        replica.num_waiting = metrics.get("vllm:num_requests_waiting", 0.0)
        replica.num_running = metrics.get("vllm:num_requests_running", 0.0)
        replica.kv_cache_usage = next((metrics[n] for n in KV_USAGE_NAMES if n in metrics), 0.0)
        replica.num_sent_since_scrape = 0
        replica.has_metrics = True
        replica.is_saturated = (
            replica.num_waiting > self.limits.max_waiting or replica.kv_cache_usage > self.limits.max_kv_cache_usage
        )

    async def _get_models(self, replica: VLLMReplica) -> tuple[int, bytes]:
        async with self._session.get(
            replica.base_url + "/models", headers=replica.headers, timeout=self._health_timeout
        ) as response:
            return response.status, await response.read()

    async def _list_adapters(self, replica: VLLMReplica) -> None:
        num_changes = self.lora.num_changes(replica)
        try:
            status, body = await self._get_models(replica)
        except (TimeoutError, aiohttp.ClientError):
            return  # the health probe says what is wrong
        self._sync_adapters(replica, status, body, num_changes)

    def _sync_adapters(self, replica: VLLMReplica, status: int, body: bytes, num_changes: int) -> None:
        listed = listed_adapters(body) if status == 200 else None
        if listed is not None:
            self.lora.sync(replica, listed, num_changes)

    async def _probe(self, replica: VLLMReplica) -> None:  # type: ignore[override]
        num_changes = self.lora.num_changes(replica)
        try:
            status, body = await self._get_models(replica)
        except (TimeoutError, aiohttp.ClientError) as exc:
            replica.is_ready, replica.last_health = False, f"{type(exc).__name__}: {exc}"
            return
        replica.is_ready = status == 200
        replica.last_health = "ok" if replica.is_ready else f"GET /models returned {status}"
        if self.lora.names:
            self._sync_adapters(replica, status, body, num_changes)

    def is_saturated(self) -> bool:
        """Every ready replica is past its limits: routing should degrade or queue."""
        ready = [r for r in self.replicas if r.is_ready]
        return bool(ready) and all(r.is_saturated for r in ready)

    # -- choice ---------------------------------------------------------------------------------

    def _choose(self, request: AnyRequest, candidates: list[VLLMReplica]) -> VLLMReplica:  # type: ignore[override]
        candidates = [r for r in candidates if r.is_ready] or list(candidates)
        key = _prefix_key(request) if self.is_sticky else None
        if key is not None:
            sticky = max(candidates, key=lambda r: _rendezvous_score(key, r))
            if not sticky.is_saturated:
                sticky.num_sent_since_scrape += 1
                return sticky
        unsaturated = [r for r in candidates if not r.is_saturated] or candidates
        return self._sent_to(min(unsaturated, key=_load_order))

    def _choose_for_adapter(self, name: str, candidates: list[VLLMReplica]) -> VLLMReplica:
        """The least-loaded replica that holds adapter `name`; when none does, or every one that
        does is saturated, the least-loaded other one with room for it, where it is placed."""
        candidates = [r for r in candidates if r.is_ready] or list(candidates)
        holders = [r for r in candidates if self.lora.holds(r, name)]
        if unsaturated := [r for r in holders if not r.is_saturated]:
            return self._sent_to(min(unsaturated, key=_load_order))
        others = [r for r in candidates if r not in holders and not r.is_saturated]
        if holders and not others:
            return self._sent_to(min(holders, key=_load_order))
        others = others or candidates
        chosen = min([r for r in others if self.lora.has_room(r)] or others, key=_load_order)
        self.lora.place(chosen, name)
        return self._sent_to(chosen)

    @staticmethod
    def _sent_to(replica: VLLMReplica) -> VLLMReplica:
        replica.num_sent_since_scrape += 1
        return replica

    def attach_breakers(self, make_breaker: Callable[[], Breaker]) -> list[tuple[str, Breaker]]:
        """Once per replica: the model's adapters share them (whichever asks first attaches them)."""
        if self.replicas[0].breaker is None:
            return super().attach_breakers(make_breaker)
        return [(r.label, r.breaker) for r in self.replicas if r.breaker is not None]

    def adapter(self, name: str, source: str) -> Backend:
        self.lora.register(name, source)
        return VLLMAdapterBackend(self, name)

    # -- tokens ---------------------------------------------------------------------------------

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """vLLM's own count (`POST /tokenize`): the model's chat template over the messages and tools
        with the generation prompt, as a chat completion renders them, or the prompt with the special
        tokens a completion adds."""
        body: dict[str, Any] = {"model": self.upstream_model}
        if isinstance(request, ChatCompletionRequest):
            payload = request.wire_payload()
            body |= {"messages": payload["messages"], "add_generation_prompt": True}
            if payload.get("tools"):
                body["tools"] = payload["tools"]
        else:
            body["prompt"] = request.prompt
        answer = await self._ask_root("/tokenize", body)
        count, tokens, max_model_len = answer.get("count"), answer.get("tokens"), answer.get("max_model_len")
        if not isinstance(count, int) or not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise BackendError(f"upstream {self.name} sent a malformed /tokenize answer", backend=self.name)
        return TokenCount(count, tokens, max_model_len=max_model_len if isinstance(max_model_len, int) else None)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        answer = await self._ask_root("/detokenize", {"model": self.upstream_model, "tokens": list(tokens)})
        prompt = answer.get("prompt")
        if not isinstance(prompt, str):
            raise BackendError(f"upstream {self.name} sent a malformed /detokenize answer", backend=self.name)
        return prompt

    async def _ask_root(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` at the root of a ready replica (vLLM serves its tokenizer there, not
        under /v1); its answer, a JSON object."""
        replica = next((r for r in self.replicas if r.is_ready), self.replicas[0])
        url = replica.base_url.removesuffix("/v1") + path
        try:
            async with self._session.post(
                url, data=orjson.dumps(body), headers=replica.headers, timeout=self._timeout
            ) as response:
                status, headers, data = response.status, response.headers, await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._fail(replica, exc) from exc
        if status != 200:
            raise self._status_error(replica, status, headers, data)
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise BackendError(f"upstream {self.name} sent a malformed {path} answer", backend=self.name)
        return answer

    async def health(self) -> BackendHealth:
        verdict = await super().health()
        loads = "; ".join(
            f"{r.label}: waiting {r.num_waiting:g}, running {r.num_running:g}, KV {r.kv_cache_usage:.0%}"
            + (" (saturated)" if r.is_saturated else "")
            for r in self.replicas
        )
        return BackendHealth(verdict.is_ready, f"{verdict.detail} | {loads}")

    async def aclose(self) -> None:
        if self._scraper is not None:
            await self._scraper.aclose()
            self._scraper = None
        await self.lora.aclose()


def _load_order(replica: VLLMReplica) -> tuple[float, int]:
    return replica.load, replica.num_outstanding


class VLLMAdapterBackend(OpenAIHTTPBackend):
    """A LoRA adapter of a vLLM model: its base's replicas (their load, health and breakers)
    asked with `"model": <adapter name>`, on a replica that has it loaded.

    A replica that answers 404 for an adapter we had loaded there has restarted: it is loaded
    again and the request sent once more.
    """

    replicas: list[VLLMReplica]  # type: ignore[assignment]  # the base's own

    def __init__(self, base: VLLMBackend, name: str) -> None:
        replicas: list[Replica] = list(base.replicas)  # the same replicas: their load, health and breakers
        super().__init__(name, replicas, base._session, upstream_model=name)
        self._timeout, self._stream_timeout, self._health_timeout = (
            base._timeout,
            base._stream_timeout,
            base._health_timeout,
        )
        self.base = base

    def _choose(self, request: AnyRequest, candidates: list[VLLMReplica]) -> VLLMReplica:  # type: ignore[override]
        return self.base._choose_for_adapter(self.name, candidates)

    def attach_breakers(self, make_breaker: Callable[[], Breaker]) -> list[tuple[str, Breaker]]:
        return self.base.attach_breakers(make_breaker)

    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult:
        replica = self._replica(request, pick)
        on_replica = Pick(replica.label)
        async with self.base.lora.using(replica, self.name):
            try:
                return await super().complete(request, on_replica)
            except BackendRejected as exc:
                if exc.status_code != 404:
                    raise
            await self.base.lora.reload(replica, self.name)
            return await super().complete(request, on_replica)

    async def complete_from_stream(
        self, request: AnyRequest, pick: Pick | None, progress: StreamProgress
    ) -> CompletionResult:
        replica = self._replica(request, pick)
        on_replica = Pick(replica.label)
        async with self.base.lora.using(replica, self.name):
            try:
                return await super().complete_from_stream(request, on_replica, progress)
            except BackendRejected as exc:
                if exc.status_code != 404:
                    raise
            await self.base.lora.reload(replica, self.name)
            return await super().complete_from_stream(request, on_replica, progress)

    async def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]:
        replica = self._replica(request, pick)
        on_replica = Pick(replica.label)
        async with self.base.lora.using(replica, self.name):
            chunks = self._stream_on(request, on_replica)
            try:
                first = await anext(chunks, None)
            except BackendRejected as exc:
                if exc.status_code != 404:
                    raise
                await self.base.lora.reload(replica, self.name)
                chunks = self._stream_on(request, on_replica)
                first = await anext(chunks, None)
            if first is None:
                return
            async with contextlib.aclosing(chunks):
                yield first
                async for chunk in chunks:
                    yield chunk

    def _stream_on(self, request: AnyRequest, pick: Pick) -> AsyncGenerator[StreamChunk, None]:
        return cast(AsyncGenerator[StreamChunk, None], super().stream(request, pick))

    async def health(self) -> BackendHealth:
        """The base's replicas' last verdict (the base probes them), and where the adapter is loaded."""
        where = ", ".join(self.base.lora.loaded_on(self.name)) or "no replica yet"
        return BackendHealth(self.base.is_ready(), f"LoRA adapter of {self.base.name}, loaded on {where}")

    def is_ready(self) -> bool:
        return self.base.is_ready()

    def is_saturated(self) -> bool:
        return self.base.is_saturated()

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """Counted by the base model, whose tokenizer the adapter shares."""
        return await self.base.tokenize(request)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self.base.detokenize(tokens)
