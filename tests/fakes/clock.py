"""A clock that moves only when a test says so, for the product's injectable clocks (`Breaker.clock`,
`ThrashGuard.clock`): a breaker's reset, a 429 cooldown or a thrash cool-off then passes when the
test advances it, never with the machine's speed, and what is left of it is exact."""

from __future__ import annotations

import time


class ManualClock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def freeze_breakers(app) -> ManualClock:
    """Every breaker of a running proxy `app` (each model's, each replica's) on one `ManualClock`."""
    clock = ManualClock()
    for guard in app.state.services.executor.guards.values():
        guard.breaker.clock = clock
        for _, breaker in guard.replicas:
            breaker.clock = clock
    return clock
