"""Metering: every attempt at a backend becomes one ledger record, linked by the request id.

Completed, cancelled (the client left) and failed attempts are all recorded, exactly once each:
failed attempts by the resilience loop as they fail, the answering attempt by the relay when the
answer is sent or the stream ends, however it ends.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from switchyard.billing.budgets import SpendTracker
from switchyard.billing.ledger import Ledger, UsageRecord
from switchyard.core.context import answered_by
from switchyard.core.errors import SwitchyardError
from switchyard.core.prices import Price
from switchyard.core.protocol import CompletionResult


class ModelEntry(Protocol):
    """What metering needs of a model entry (`switchyard.backends.registry.ModelEntry`)."""

    name: str
    backend_kind: str


_USAGE = re.compile(rb'"usage"\s*:\s*(\{[^{}]*\})')


def usage_of(result: CompletionResult) -> dict | None:
    """The usage object of an answer, found without parsing the whole (possibly large) body."""
    if result._parsed is not None:
        return result._parsed.get("usage")
    match = _USAGE.search(result.data)
    return orjson.loads(match.group(1)) if match else None


@dataclass
class RequestMeter:
    """The metering of one client request; attempts are numbered in the order they were made."""

    ledger: Ledger | None
    prices: dict[str, Price]
    request_id: str
    counts: Counter | None = None  # (model, status) -> attempts, for /metrics
    prompt_tokens_estimate: int = 0  # used when an attempt ends without the upstream's usage
    attempt_started_at: float = field(default_factory=time.time)
    current_entry: ModelEntry | None = None
    backend_label: str | None = None  # the deployment, when it answered in another task (a cascade rung)
    team: str | None = None  # the calling team (teams configured); its spend grows with each attempt
    spend: SpendTracker | None = None
    is_closed: bool = False
    _sequence: list[int] = field(default_factory=lambda: [0])  # shared by forks: attempt numbers

    @property
    def num_attempts(self) -> int:
        return self._sequence[0]

    def fork(self) -> RequestMeter:
        """A meter for an attempt that runs beside this one (a hedge): same request, same numbering."""
        return RequestMeter(
            self.ledger,
            self.prices,
            self.request_id,
            self.counts,
            self.prompt_tokens_estimate,
            team=self.team,
            spend=self.spend,
            _sequence=self._sequence,
        )

    def begin_attempt(self) -> None:
        self.attempt_started_at = time.time()

    def failed(self, entry: ModelEntry, error: SwitchyardError) -> None:
        self._write(entry, "failed", None, 0, error=error.message)

    def escalated(self, entry: ModelEntry, usage: dict | None, num_tokens: int, reason: str) -> None:
        """An answer the cascade judged and did not send (a stream cut short, or a whole answer)."""
        self.finished(entry, "escalated", usage, num_tokens, reason)

    def finished(
        self, entry: ModelEntry, status: str, usage: dict | None, num_chunks: int = 0, error: str | None = None
    ) -> None:
        """The answering attempt: once, however it ended."""
        if self.is_closed:
            return
        self.is_closed = True
        self._write(entry, status, usage, num_chunks, error)

    def _write(self, entry: ModelEntry, status: str, usage: dict | None, num_chunks: int, error: str | None = None):
        self._sequence[0] += 1
        if self.counts is not None:
            self.counts[(entry.name, status)] += 1
        if self.ledger is None and self.spend is None:
            return
        prompt = int(usage.get("prompt_tokens") or 0) if usage else (self.prompt_tokens_estimate if num_chunks else 0)
        completion = int((usage or {}).get("completion_tokens") or 0) if usage else num_chunks
        price = self.prices.get(entry.name)
        cost = price.cost_usd(prompt, completion) if price is not None else 0.0
        if self.spend is not None and self.team is not None:
            self.spend.add(self.team, cost, self.attempt_started_at)
        if self.ledger is not None:
            self.ledger.record(
                UsageRecord(
                    request_id=self.request_id,
                    attempt=self.num_attempts,
                    model=entry.name,
                    backend=answered_by.get() or self.backend_label or entry.backend_kind,
                    status=status,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                    cost_usd=cost,
                    is_estimated=usage is None and completion > 0,
                    started_at=self.attempt_started_at,
                    duration_ms=(time.time() - self.attempt_started_at) * 1000,
                    error=error,
                    team=self.team,
                )
            )
        self.begin_attempt()
