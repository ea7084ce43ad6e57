"""Refused requests: answered with an error before any model was called.

A refusal of a known caller (its team and key) is metered as one ledger record of its own, status
`refused`, attempt 0, no model, tokens or cost, with its reason in `error`: every request is in
the ledger once, and the figures that count requests, tokens, cost and latency leave it out.
The reason is the OpenAI error code the client was sent, with the common ones shortened.
"""

from __future__ import annotations

from switchyard.billing.records import REFUSED, UsageRecord
from switchyard.core.errors import SwitchyardError

_SHORT_REASONS = {"insufficient_quota": "budget", "rate_limit_exceeded": "rate_limit"}


def refusal_reason(error: SwitchyardError) -> str:
    """`budget`, `rate_limit`, else the error's code (`unsupported_parameter`, `model_not_found`,
    ...), else its type without `_error` (`invalid_request`)."""
    if error.code:
        return _SHORT_REASONS.get(error.code, error.code)
    return error.error_type.removesuffix("_error")


def refusal_record(
    *,
    request_id: str,
    reason: str,
    started_at: float,
    duration_ms: float,
    team: str | None,
    key_id: str | None,
    requested_model: str | None,
    client_request_id: str | None = None,
) -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        attempt=0,
        model="",
        backend="",
        status=REFUSED,
        prompt_tokens=0,
        completion_tokens=0,
        cost_usd=0.0,
        is_estimated=False,
        started_at=started_at,
        duration_ms=duration_ms,
        error=reason,
        team=team,
        client_request_id=client_request_id,
        key_id=key_id,
        requested_model=requested_model,
    )
