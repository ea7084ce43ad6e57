"""A request's totals, shared by its forks: what the request log reports as the answer and its cost."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from switchyard.billing.metering import RequestMeter
from switchyard.core.errors import SwitchyardError
from switchyard.core.prices import Price


@dataclass
class Entry:
    name: str
    backend_kind: str = "openai"
    tier: str | None = None
    hosting: str | None = None


PRICES = {"cheap": Price(input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)}
USAGE = {"prompt_tokens": 10, "completion_tokens": 4}


def test_the_completed_attempt_is_the_answer_whatever_order_the_forks_close_in():
    meter = RequestMeter(None, PRICES, "req_1")
    meter.failed(Entry("cheap"), SwitchyardError("upstream broke"))
    winner, loser = meter.fork(), meter.fork(is_hedge=True)
    loser.finished(Entry("other"), "cancelled", None)
    winner.first_token_at = winner.attempt_started_at + 0.25
    winner.finished(Entry("cheap"), "completed", USAGE)
    late = meter.fork(is_hedge=True)
    late.finished(Entry("other"), "cancelled", None)
    totals = meter.totals
    assert (totals.answer_model, totals.answer_status) == ("cheap", "completed")
    assert totals.ttft_s == 0.25
    assert totals.attempts == ["cheap:failed", "other:cancelled", "cheap:completed", "other:cancelled"]
    assert (totals.prompt_tokens, totals.completion_tokens) == (10, 4)
    assert meter.num_attempts == 4 and meter.total_cost_usd == totals.cost_usd == pytest.approx(18e-6)


def test_an_escalated_rung_is_not_the_answer():
    meter = RequestMeter(None, PRICES, "req_2")
    meter.fork().escalated(Entry("cheap"), USAGE, 4, "low-confidence")
    assert meter.totals.answer_model is None and meter.totals.attempts == ["cheap:escalated"]
