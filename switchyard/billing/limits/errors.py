"""The refusal of a rate check that some buckets could not pay (`RateLimitExceeded`, in the error
tree of `switchyard.core.errors` with `LimitsUnavailable`, Valkey or Redis unreachable).

A budget that does not fit is not an exception here: `Limiter.reserve` returns False and the caller
raises `BudgetExceeded` (429 insufficient_quota) with its own message.
"""

from __future__ import annotations

from switchyard.billing.limits.scopes import BucketLevel, format_duration, tightest
from switchyard.core.errors import RateLimitExceeded


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
