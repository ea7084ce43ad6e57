"""The two ways a limit check refuses a request.

    SwitchyardError
    ├── RateLimited                     429 rate_limit_exceeded
    │   └── RateLimitExceeded           a key's or team's RPM/TPM is used up: retry-after + x-ratelimit-*
    └── LimitsUnavailable               503 limits_unavailable: Valkey/Redis unreachable, fail_open off

A budget that does not fit is not an exception here: `Limiter.reserve` returns False and the caller
raises `BudgetExceeded` (429 insufficient_quota) with its own message.
"""

from __future__ import annotations

import math

from switchyard.billing.limits.scopes import BucketLevel, RateStatus, format_duration, tightest
from switchyard.core.errors import RateLimited, SwitchyardError


class RateLimitExceeded(RateLimited):
    def __init__(
        self, message: str, *, status: RateStatus, retry_after_s: float | None, limit: str = "requests"
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.status = status
        self.limit = limit  # the bucket's kind that refused it: requests or tokens

    def headers(self) -> dict[str, str]:
        headers = self.status.headers()
        if self.retry_after_s is not None:  # rounded up: a client retrying on time finds the room there
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


class LimitsUnavailable(SwitchyardError):
    status_code = 503
    error_type = "server_error"
    code = "limits_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=1.0)


def rate_refusal(levels: list[BucketLevel], refused: list[tuple[BucketLevel, int]]) -> RateLimitExceeded:
    """The 429 for a check some buckets could not pay: `refused` pairs each with what it was asked."""
    status = tightest(levels)
    too_large = [(bucket, cost) for bucket, cost in refused if cost > bucket.capacity]
    if too_large:
        bucket, cost = too_large[0]
        return RateLimitExceeded(
            f"This request needs {cost} {bucket.kind} but {bucket.scope} allows {bucket.capacity} {bucket.kind} "
            "per minute: it cannot be admitted at any rate. Ask for fewer tokens (max_tokens) or a higher limit.",
            status=status,
            retry_after_s=None,
            limit=bucket.kind,
        )
    waits = [((cost - bucket.level) * 60.0 / bucket.capacity, bucket) for bucket, cost in refused]
    wait_s, bucket = max(waits, key=lambda pair: pair[0])
    return RateLimitExceeded(
        f"Rate limit reached for {bucket.scope}: {bucket.capacity} {bucket.kind} per minute. "
        f"Try again in {format_duration(wait_s)}.",
        status=status,
        retry_after_s=wait_s,
        limit=bucket.kind,
    )
