"""What a limit applies to, and what a rate check reports.

`BudgetScope` is a spend limit in USD for one UTC period (a day or a month) of one scope ("team:search",
"key:key_ab12"); `RateScope` is a requests-per-minute and tokens-per-minute pair. `RateStatus` is the
tightest scope after a check, rendered as OpenAI's `x-ratelimit-*` headers.

Money is counted in whole nano-dollars (`to_nano_usd`), in this process and in Valkey alike: sums of
floats drift (fifty reservations of $0.001 add up to a hair over $0.05), integers do not, and 2**53
nano-dollars is nine million dollars, far above any one scope's budget.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

NANO_PER_USD = 1_000_000_000
PERIODS = ("day", "month")
PERIOD_GRACE_S = 86_400.0  # counters outlive their period by a day, for late settles and reads


def to_nano_usd(usd: float) -> int:
    return round(usd * NANO_PER_USD)


def to_usd(nano_usd: int | float) -> float:
    return nano_usd / NANO_PER_USD


@dataclass(frozen=True, slots=True)
class BudgetScope:
    name: str  # "team:search", "key:key_ab12"
    period: str  # "day" | "month" (UTC)
    limit_usd: float

    def __post_init__(self) -> None:
        if self.period not in PERIODS:
            raise ValueError(f"budget period must be one of {PERIODS}, not {self.period!r}")

    def period_id(self, at: float) -> str:
        """The UTC period holding `at`: "d:2026-11-23" or "m:2026-11"."""
        day = dt.datetime.fromtimestamp(at, dt.UTC)
        return day.strftime("d:%Y-%m-%d") if self.period == "day" else day.strftime("m:%Y-%m")

    def period_end(self, at: float) -> float:
        """Unix seconds when the period holding `at` ends."""
        moment = dt.datetime.fromtimestamp(at, dt.UTC)
        if self.period == "day":
            start = dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.UTC)
            return (start + dt.timedelta(days=1)).timestamp()
        year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
        return dt.datetime(year, month, 1, tzinfo=dt.UTC).timestamp()

    def keep_s(self, at: float) -> int:
        """How long counters for the period holding `at` are kept, counted from `at`."""
        return max(1, math.ceil(self.period_end(at) + PERIOD_GRACE_S - at))


@dataclass(frozen=True, slots=True)
class RateScope:
    name: str
    rpm: int | None = None  # requests per minute; None: no limit
    tpm: int | None = None  # tokens per minute; None: no limit


@dataclass(frozen=True, slots=True)
class RateStatus:
    """The tightest scope's standing after a check (requests and tokens chosen apart)."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None  # until the bucket is full again
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind in ("requests", "tokens"):
            limit = getattr(self, f"limit_{kind}")
            if limit is None:
                continue
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(getattr(self, f"remaining_{kind}"))
            headers[f"x-ratelimit-reset-{kind}"] = format_duration(getattr(self, f"reset_{kind}_s"))
        return headers


def format_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in `x-ratelimit-reset-*`: "20ms", "1s", "6.5s", "6m0s", "1h2m3s"."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms" if seconds > 0 else "0s"
    milliseconds = math.ceil(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


@dataclass(frozen=True, slots=True)
class BucketLevel:
    """One token bucket after a check: what it holds, how big it is (a minute's worth)."""

    scope: str
    kind: str  # "requests" | "tokens"
    capacity: int
    level: float  # may be fractional: the bucket refills continuously

    @property
    def reset_s(self) -> float:
        return (self.capacity - self.level) * 60.0 / self.capacity


def _standing(levels: list[BucketLevel], kind: str) -> tuple[int | None, int | None, float | None]:
    """The tightest bucket of `kind`: its limit, what remains, seconds until it is full again."""
    of_kind = [b for b in levels if b.kind == kind]
    if not of_kind:
        return None, None, None
    bucket = min(of_kind, key=lambda b: (b.level, -b.reset_s))
    return bucket.capacity, max(0, math.floor(bucket.level)), max(0.0, bucket.reset_s)


def tightest(levels: list[BucketLevel]) -> RateStatus:
    limit_requests, remaining_requests, reset_requests_s = _standing(levels, "requests")
    limit_tokens, remaining_tokens, reset_tokens_s = _standing(levels, "tokens")
    return RateStatus(
        limit_requests=limit_requests,
        remaining_requests=remaining_requests,
        reset_requests_s=reset_requests_s,
        limit_tokens=limit_tokens,
        remaining_tokens=remaining_tokens,
        reset_tokens_s=reset_tokens_s,
    )
