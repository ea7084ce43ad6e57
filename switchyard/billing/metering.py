"""Metering: every attempt at a backend becomes one ledger record, linked by the request id.

`RequestMeter` implements the protocol the backends and the cascade report attempts through
(`switchyard.core.metering.AttemptMeter`), and is the one owner of the ledger's rows. Completed,
cancelled (the client left) and failed attempts are all recorded, exactly once each: failed
attempts by the resilience loop as they fail, the answering attempt by the relay when the answer
is sent or the stream ends, however it ends.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from switchyard.billing.budgets import Spending
from switchyard.billing.ledger import Ledger
from switchyard.billing.records import UsageRecord, escalation_outcome, is_answer
from switchyard.core.chat_wire import CompletionResult
from switchyard.core.errors import BudgetExceeded, SwitchyardError
from switchyard.core.estimates import estimated_cost_usd
from switchyard.core.metering import MeteredModel
from switchyard.core.metrics import Metrics
from switchyard.core.model_settings import HOSTING_LABELS, SELF_HOSTED_BACKENDS
from switchyard.core.prices import Price
from switchyard.core.requests import AnyRequest

Sent = Literal["whole", "stream"]  # how the relay sent an attempt's answer to its client
CACHE_DEPLOYMENT = "response-cache"  # the deployment a response-cache hit's record names


def hosting_of(entry: MeteredModel) -> str:
    if entry.hosting is not None:
        return entry.hosting
    return HOSTING_LABELS["self" if entry.backend_kind in SELF_HOSTED_BACKENDS else "commercial"]


@dataclass(frozen=True, slots=True)
class RequestTags:
    """What every record of one request carries for the reports."""

    client_request_id: str | None = None
    key_id: str | None = None
    requested_model: str | None = None
    route: str | None = None  # why this model (x-switchyard-route, plus ";degraded")
    score: float | None = None
    ceiling_model: str | None = None  # the strongest model the route could have reached
    batch_id: str | None = None  # a batch's line (the batch tier)
    routing_version: str | None = None  # the routing version that routed it (auto, cascade)
    is_shadow: bool = False  # a shadow or judge call (switchyard.learning): never answered the client
    response_cache: str | None = None  # miss | bypass: the response cache's word, on the answer's record


@dataclass(slots=True)
class RequestTotals:
    """What every attempt of one request adds up to, shared by its forks (rungs, hedges)."""

    num_attempts: int = 0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: list[str] = field(default_factory=list)  # "model:status", in the order they were metered
    answer_model: str | None = None  # the attempt that answered: the completed one, else the last one closed
    answer_status: str | None = None
    ttft_s: float | None = None  # the answering attempt's time to its first chunk (streams, assembled answers)
    # The answer by the reports' rule (`switchyard.billing.records.is_answer`), and the rung it climbed from.
    last_answer_model: str | None = None
    last_answer_escalated_from: str | None = None
    last_answer_status: str | None = None
    last_answer_attempt: int = 0
    # As the client saw it, in `time.monotonic()` seconds: when the proxy received the request (None:
    # not known, and no client times are recorded) and when the first byte of its answer was written.
    received_at: float | None = None
    first_byte_at: float | None = None

    @property
    def escalation(self) -> str:
        """accepted | escalated | failed (`switchyard.billing.records.escalation_outcome`)."""
        return escalation_outcome(self.last_answer_model, self.last_answer_escalated_from)


_USAGE_KEY = re.compile(rb'"usage"\s*:\s*\{')


def usage_of(result: CompletionResult) -> dict[str, Any] | None:
    """The usage object of an answer, found without parsing the whole (possibly large) body."""
    if result._parsed is not None:
        return result._parsed.get("usage")
    data = result.data
    at = data.find(b'"usage"')
    while at >= 0:
        key = _USAGE_KEY.match(data, at)
        if key is not None and (end := _object_end(data, key.end())) > 0:
            return orjson.loads(data[key.end() - 1 : end])  # type: ignore[no-any-return]
        at = data.find(b'"usage"', at + 1)
    return None


def _object_end(data: bytes, start: int) -> int:
    """Where the object whose `{` is just before `start` ends (past its `}`), 0 if it does not.
    Its braces are counted with find and count: a regex walking it byte by byte cost ~15 us."""
    depth = 1
    while depth:
        close = data.find(b"}", start)
        if close < 0:
            return 0
        depth += data.count(b"{", start, close) - 1
        start = close + 1
    return start


def cached_prompt_tokens(usage: dict[str, Any] | None) -> int:
    """Prompt tokens the upstream read from its prefix cache (OpenAI's, vLLM's and the embedded
    engine's `usage.prompt_tokens_details.cached_tokens`), 0 when it says none."""
    details = (usage or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached > 0 else 0


def cache_write_tokens(usage: dict[str, Any] | None) -> int:
    """Prompt tokens the upstream wrote to its prompt cache (`usage.cache_creation_input_tokens`,
    as LiteLLM reports Anthropic's), 0 when it says none."""
    written = (usage or {}).get("cache_creation_input_tokens")
    return written if isinstance(written, int) and written > 0 else 0


@dataclass
class RequestMeter:
    """The metering of one client request; attempts are numbered in the order they were made."""

    ledger: Ledger | None
    prices: dict[str, Price]
    request_id: str  # the proxy's own id
    counts: Counter[tuple[str, str]] | None = None  # (model, status) -> attempts, for /metrics
    prompt_tokens_estimate: int = 0  # used when an attempt ends without the upstream's usage
    attempt_started_at: float = field(default_factory=time.time)
    team: str | None = None  # the calling team (teams configured)
    spending: Spending | None = None  # the request's budgets: each attempt's cost is charged to them
    tags: RequestTags = field(default_factory=RequestTags)
    escalated_from: str | None = None  # this fork's rung climbed from that model
    is_hedge: bool = False
    first_token_at: float | None = None  # unix seconds, when a stream's first chunk arrived (assembled too)
    is_closed: bool = False
    totals: RequestTotals = field(default_factory=RequestTotals)  # shared by forks
    metrics: Metrics | None = None  # the app's Prometheus metrics: tokens, cost, time to first token
    upstream_s: float = 0.0  # seconds spent in this meter's attempts (the proxy overhead is the rest)
    # the cascade's verdict on this fork's answer: its confidence (None: no logprobs) and threshold
    confidence: float | None = None
    threshold: float | None = None  # None: not judged

    @property
    def num_attempts(self) -> int:
        return self.totals.num_attempts

    def routed(
        self, route: str | None, score: float | None, ceiling_model: str | None, routing_version: str | None = None
    ) -> None:
        """How the request was routed, once decided (before its first attempt): its records say so."""
        self.tags = replace(
            self.tags, route=route, score=score, ceiling_model=ceiling_model, routing_version=routing_version
        )

    @property
    def total_cost_usd(self) -> float:
        """What the whole request has cost so far, every attempt of every fork."""
        return self.totals.cost_usd

    def fork(self, *, escalated_from: str | None = None, is_hedge: bool = False) -> RequestMeter:
        """A meter for an attempt that runs beside this one (a rung, a hedge): same request, same numbering."""
        return RequestMeter(
            self.ledger,
            self.prices,
            self.request_id,
            self.counts,
            self.prompt_tokens_estimate,
            team=self.team,
            spending=self.spending,
            tags=self.tags,
            escalated_from=escalated_from,
            is_hedge=is_hedge,
            totals=self.totals,
            metrics=self.metrics,
        )

    # -- the caller's budgets, held for its attempts -----------------------------------------

    def worst_case_cost_usd(self, model: str, request: AnyRequest) -> float:
        return estimated_cost_usd(request, self.prices.get(model))

    async def reserve_for(self, model: str, request: AnyRequest) -> bool:
        """Hold the worst-case cost of calls to `model` in the caller's budgets, once per model and
        request however often it is asked (True: it fits, or is held already)."""
        spending = self.spending
        if spending is None:
            return True
        return await spending.reserve_for(model, self.worst_case_cost_usd(model, request))

    async def refusal_for(self, model: str, request: AnyRequest) -> BudgetExceeded | None:
        """Why `model`'s worst case does not fit the caller's budgets, and when to retry (None: no budgets)."""
        spending = self.spending
        if spending is None:
            return None
        return await spending.refusal_for(model, self.worst_case_cost_usd(model, request))

    # -- the attempts ------------------------------------------------------------------------

    def begin_attempt(self) -> None:
        self.attempt_started_at = time.time()
        self.first_token_at = None
        self.confidence, self.threshold = None, None

    def judged(self, confidence: float | None, threshold: float) -> None:
        """The cascade judged this attempt's answer: the record keeps both numbers."""
        self.confidence, self.threshold = confidence, threshold

    def first_byte(self) -> None:
        """The first byte of the request's answer is being written to its client."""
        if self.totals.first_byte_at is None:
            self.totals.first_byte_at = time.monotonic()

    def first_token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.time()

    def failed(
        self, entry: MeteredModel, error: SwitchyardError, *, deployment: str | None = None, num_chunks: int = 0
    ) -> None:
        """An attempt that failed (`deployment`: where it went, if it was called; `num_chunks`: of
        an answer assembled before it failed, its tokens estimated from them)."""
        self._write(entry, "failed", None, num_chunks, error=error.message, deployment=deployment)

    def escalated(
        self,
        entry: MeteredModel,
        usage: dict[str, Any] | None,
        num_tokens: int,
        reason: str,
        *,
        deployment: str | None = None,
    ) -> None:
        """An answer the cascade judged and did not send (a stream cut short, or a whole answer)."""
        self.finished(entry, "escalated", usage, num_tokens, reason, deployment=deployment)

    def finished(
        self,
        entry: MeteredModel,
        status: str,
        usage: dict[str, Any] | None,
        num_chunks: int = 0,
        error: str | None = None,
        *,
        deployment: str | None = None,
        sent: Sent | None = None,
    ) -> None:
        """The answering attempt: once, however it ended (`deployment`: where it went; `sent`: the
        relay sent its answer to the client, whole or as a stream, so its record carries the
        client's times)."""
        if self.is_closed:
            return
        self.is_closed = True
        totals = self.totals
        if status != "escalated" and totals.answer_status != "completed":
            totals.answer_model, totals.answer_status = entry.name, status
            totals.ttft_s = self.first_token_at - self.attempt_started_at if self.first_token_at is not None else None
        self._write(entry, status, usage, num_chunks, error, deployment, sent=sent)

    def cache_looked_up(self, result: str) -> None:
        """The response cache missed (or was bypassed): the answer's record says so."""
        self.tags = replace(self.tags, response_cache=result)

    def from_cache(
        self, entry: MeteredModel, *, cost_usd: float, saved_tokens: int, saved_usd: float, sent: Sent
    ) -> None:
        """The request was answered from the response cache: its one record, completed, at the
        hit's price (`cost_usd`), with what answering it again would have cost."""
        if self.is_closed:
            return
        self.is_closed = True
        self.totals.answer_model, self.totals.answer_status = entry.name, "completed"
        self._write(
            entry, "completed", None, 0, deployment=CACHE_DEPLOYMENT, sent=sent, hit=(cost_usd, saved_tokens, saved_usd)
        )

    def tokens(self, usage: dict[str, Any] | None, num_chunks: int) -> tuple[int, int]:
        """(prompt, completion) tokens: the upstream's usage, else estimated (a chunk a token)."""
        if usage:
            return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        return (self.prompt_tokens_estimate if num_chunks else 0), num_chunks

    def cost_of(
        self, model: str | None, prompt: int, completion: int, cached_prompt: int = 0, cache_write: int = 0
    ) -> float:
        price = self.prices.get(model) if model is not None else None
        return price.cost_usd(prompt, completion, cached_prompt, cache_write) if price is not None else 0.0

    def usage_cost_usd(self, model: str, usage: dict[str, Any]) -> float:
        """What an attempt with this usage costs on `model`, its prompt-cache reads and writes priced."""
        prompt, completion = self.tokens(usage, 0)
        return self.cost_of(model, prompt, completion, cached_prompt_tokens(usage), cache_write_tokens(usage))

    def _write(
        self,
        entry: MeteredModel,
        status: str,
        usage: dict[str, Any] | None,
        num_chunks: int,
        error: str | None = None,
        deployment: str | None = None,
        *,
        sent: Sent | None = None,
        hit: tuple[float, int, float] | None = None,  # a response-cache hit: its cost, the tokens and USD saved
    ) -> None:
        totals = self.totals
        totals.num_attempts += 1
        if is_answer(status, totals.num_attempts, totals.last_answer_status, totals.last_answer_attempt):
            totals.last_answer_model, totals.last_answer_escalated_from = entry.name, self.escalated_from
            totals.last_answer_status, totals.last_answer_attempt = status, totals.num_attempts
        if self.counts is not None:
            self.counts[(entry.name, status)] += 1
        prompt, completion = self.tokens(usage, num_chunks)
        cached_prompt, cache_write = cached_prompt_tokens(usage), cache_write_tokens(usage)
        cost = self.cost_of(entry.name, prompt, completion, cached_prompt, cache_write) if hit is None else hit[0]
        totals.cost_usd += cost
        totals.prompt_tokens += prompt
        totals.completion_tokens += completion
        totals.attempts.append(f"{entry.name}:{status}")
        if self.spending is not None:
            self.spending.charge(cost)
        now = time.time()
        self.upstream_s += now - self.attempt_started_at
        request_ttfb_ms: float | None = None
        request_duration_ms: float | None = None
        if sent is not None and totals.received_at is not None:
            ended_at = time.monotonic()
            if sent == "whole":  # written at once: its first byte is its last
                totals.first_byte_at = ended_at
            request_duration_ms = (ended_at - totals.received_at) * 1000
            if totals.first_byte_at is not None:
                request_ttfb_ms = (totals.first_byte_at - totals.received_at) * 1000
        if self.metrics is not None:
            ttft_s = self.first_token_at - self.attempt_started_at if self.first_token_at is not None else None
            self.metrics.attempt_done(
                team=self.team,
                model=entry.name,
                prompt=prompt,
                completion=completion,
                cost_usd=cost,
                ttft_s=ttft_s,
                cache_read=cached_prompt,
                cache_write=cache_write,
            )
        if self.ledger is not None:
            tags = self.tags
            is_routed = tags.ceiling_model is not None and status == "completed"
            self.ledger.record(
                UsageRecord(
                    request_id=self.request_id,
                    attempt=self.num_attempts,
                    model=entry.name,
                    backend=deployment or entry.backend_kind,
                    status=status,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost_usd=cost,
                    is_estimated=usage is None and completion > 0,
                    started_at=self.attempt_started_at,
                    duration_ms=(now - self.attempt_started_at) * 1000,  # ends before the request's end
                    error=error,
                    team=self.team,
                    client_request_id=tags.client_request_id,
                    key_id=tags.key_id,
                    requested_model=tags.requested_model,
                    tier=entry.tier,
                    route=tags.route,
                    score=tags.score,
                    escalated_from=self.escalated_from,
                    ttft_ms=(
                        (self.first_token_at - self.attempt_started_at) * 1000
                        if self.first_token_at is not None
                        else None
                    ),
                    is_hedge=self.is_hedge,
                    is_shadow=tags.is_shadow,
                    hosting=hosting_of(entry),
                    ceiling_cost_usd=(
                        self.cost_of(tags.ceiling_model, prompt, completion, cached_prompt, cache_write)
                        if is_routed
                        else None
                    ),
                    batch_id=tags.batch_id,
                    confidence=self.confidence,
                    threshold=self.threshold,
                    request_ttfb_ms=request_ttfb_ms,
                    request_duration_ms=request_duration_ms,
                    routing_version=tags.routing_version,
                    cache_read_tokens=cached_prompt if usage is not None else None,
                    cache_write_tokens=cache_write if usage is not None else None,
                    response_cache="hit" if hit is not None else (tags.response_cache if sent is not None else None),
                    response_cache_saved_tokens=hit[1] if hit is not None else None,
                    response_cache_saved_usd=hit[2] if hit is not None else None,
                )
            )
        self.begin_attempt()
