"""vLLM: the OpenAI-compatible HTTP backend plus what vLLM's servers tell about their load.

Every few seconds each replica's Prometheus `/metrics` is read (`vllm:num_requests_waiting`,
`vllm:num_requests_running`, KV-cache usage). A request then goes to:

1. if it has a system prompt: the replica that rendezvous hashing assigns to that prompt, so the
   replica's prefix cache keeps serving it — unless that replica is saturated or down;
2. otherwise (or when the sticky replica is saturated): the least-loaded ready replica, counting
   the last scrape plus what we sent since.

A replica is saturated when its waiting queue or its KV-cache usage passes the configured limits;
`is_saturated()` (every ready replica saturated) is the signal routing uses to degrade or queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from switchyard.backends.base import AnyRequest, BackendHealth
from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.core.protocol import ChatCompletionRequest
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
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.metrics_interval_s = metrics_interval_s
        self.limits = limits or SaturationLimits()
        self.is_sticky = is_sticky
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
        await asyncio.gather(*(self._scrape(replica) for replica in self.replicas))

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
        chosen = min(unsaturated, key=lambda r: (r.load, r.num_outstanding))
        chosen.num_sent_since_scrape += 1
        return chosen

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
