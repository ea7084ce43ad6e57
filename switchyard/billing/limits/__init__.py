"""Budgets and rate limits: in this process, or shared by every replica in Valkey/Redis.

Budgets are reserved before a call (its worst-case cost) and settled after it (its real cost), per
scope ("team:search", "key:key_ab12") and UTC period (day, month); a reservation that would not fit
in every scope is refused whole. A reservation nobody settles lapses after its TTL.

Rate limits are token buckets, one per scope and kind (requests, tokens): a bucket holds a minute's
allowance (`rpm` or `tpm`), refills continuously at allowance / 60 per second, and a request takes
1 request and its tokens from every bucket of its scopes, all or nothing. Chosen over a sliding
window because it needs two numbers per bucket (level, last update) instead of a log of every
request, gives an exact `Retry-After` ((cost - level) / refill rate) and `x-ratelimit-reset-*`
(time until full), and lets a quiet caller burst up to one minute's allowance, as OpenAI's limits do.

`open_limiter(settings.billing)` picks `ValkeyLimiter` when `redis_url` names a server, else
`LocalLimiter` (`serve --workers N` hands its workers the URL of its private Valkey).
"""

from __future__ import annotations

from switchyard.billing.limits.base import Limiter
from switchyard.billing.limits.local import LocalLimiter
from switchyard.billing.limits.scopes import BudgetScope, RateScope, RateStatus, format_duration
from switchyard.billing.limits.valkey import ValkeyLimiter
from switchyard.core.settings import BillingSettings

__all__ = [
    "BudgetScope",
    "Limiter",
    "LocalLimiter",
    "RateScope",
    "RateStatus",
    "ValkeyLimiter",
    "format_duration",
    "open_limiter",
]


def open_limiter(billing: BillingSettings) -> Limiter:
    """The limiter the settings ask for; call `await limiter.start()` before use."""
    if (url := billing.valkey_url()) is not None:
        return ValkeyLimiter(url, fail_open=billing.fail_open)
    return LocalLimiter()
