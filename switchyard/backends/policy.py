"""The settings of resilience (`server.resilience` and a model's own overrides), as the executor
reads them; the order in which they apply is written down in `switchyard.backends.resilience`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResiliencePolicy:
    max_attempts: int = 2
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    max_retry_after_s: float = 5.0
    first_token_timeout_s: float | None = 20.0
    first_token_budget_s: float | None = 45.0
    attempt_timeout_s: float | None = None
    request_timeout_s: float | None = 600.0
    breaker_fail_max: int = 5
    breaker_reset_s: float = 30.0
    max_cooldown_s: float = 60.0
    default_cooldown_s: float = 1.0
    max_in_flight: int | None = None
    saturation_wait_s: float = 10.0
    saturation_max_waiting: int = 64
