"""The pieces under both limiters: periods, money in nano-dollars, OpenAI's headers, the errors."""

from __future__ import annotations

import datetime as dt

import pytest

from switchyard.billing.limits import BudgetScope, RateStatus, format_duration
from switchyard.billing.limits.scopes import BucketLevel, tightest, to_nano_usd, to_usd
from switchyard.core.errors import LimitsUnavailable, RateLimited, RateLimitExceeded, SwitchyardError, error_body


def at(*parts: int) -> float:
    return dt.datetime(*parts, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (0.02, "20ms"), (0.0201, "21ms"), (1, "1s"), (6.5, "6.5s"), (8.64, "8.64s"), (59.9991, "1m0s"),
     (60, "1m0s"), (360, "6m0s"), (90.5, "1m30.5s"), (3723, "1h2m3s")],
)  # fmt: skip
def test_durations_are_written_as_openai_writes_them(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown


def test_periods_are_utc_days_and_months() -> None:
    day, month = BudgetScope("team:a", "day", 1.0), BudgetScope("team:a", "month", 1.0)
    last_second = at(2026, 12, 31, 23, 59, 59)
    assert day.period_id(last_second) == "d:2026-12-31"
    assert month.period_id(last_second) == "m:2026-12"
    assert day.period_end(last_second) == at(2027, 1, 1) == month.period_end(last_second)
    assert day.period_id(at(2027, 1, 1)) == "d:2027-01-01"
    assert month.period_end(at(2026, 2, 10)) == at(2026, 3, 1)
    assert day.keep_s(last_second) == 1 + 86_400  # the period's last second, then a day of grace


def test_a_budget_period_is_a_day_or_a_month() -> None:
    with pytest.raises(ValueError, match="period"):
        BudgetScope("team:a", "week", 1.0)


def test_money_is_counted_in_whole_nano_dollars() -> None:
    assert sum(to_nano_usd(0.001) for _ in range(50)) == to_nano_usd(0.05)
    assert sum(0.001 for _ in range(50)) != 0.05  # what a float sum would have refused
    assert to_usd(to_nano_usd(0.15e-6)) == pytest.approx(0.15e-6)  # one token at $0.15 per million


def test_the_status_headers_name_only_the_limits_that_apply() -> None:
    status = RateStatus(limit_requests=60, remaining_requests=59, reset_requests_s=1.0)
    assert status.headers() == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
    }
    assert RateStatus().headers() == {}


def test_the_tightest_bucket_of_each_kind_is_reported() -> None:
    status = tightest(
        [
            BucketLevel("team:a", "requests", 100, 90.0),
            BucketLevel("key:b", "requests", 10, 4.5),
            BucketLevel("team:a", "tokens", 1000, 0.0),
        ]
    )
    assert (status.limit_requests, status.remaining_requests) == (10, 4)
    assert status.reset_requests_s == pytest.approx(33.0)
    assert (status.limit_tokens, status.remaining_tokens, status.reset_tokens_s) == (1000, 0, 60.0)


def test_a_rate_limit_refusal_is_openais_429_with_its_headers() -> None:
    status = RateStatus(limit_requests=3, remaining_requests=0, reset_requests_s=60.0)
    refusal = RateLimitExceeded("Rate limit reached", status=status, retry_after_s=12.2)
    assert isinstance(refusal, RateLimited)
    assert (refusal.status_code, refusal.code) == (429, "rate_limit_exceeded")
    assert refusal.headers() == {**status.headers(), "retry-after": "13"}  # rounded up, never early
    assert refusal.status is status


def test_limits_unavailable_is_a_503_in_openais_shape() -> None:
    down = LimitsUnavailable("Budgets and rate limits are unavailable: …")
    assert isinstance(down, SwitchyardError)
    assert (down.status_code, down.code) == (503, "limits_unavailable")
    assert b'"code":"limits_unavailable"' in error_body(down)
