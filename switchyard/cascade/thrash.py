"""The thrash guard: a route that escalates most of the time starts one rung higher for a while.

Seed failure mode "routing thrash": when the cheap rung is rarely good enough for a route (a
starting rung), every request pays for the cheap attempt and the escalation. The guard keeps the
last `window` outcomes per route; once at least `min_requests` are in and the escalation share
passes `limit`, the route starts one rung higher for `cool_off_s`, then tries the cheap rung again
with a fresh window. Each trip is counted (`/metrics`: switchyard_cascade_thrash_trips_total).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThrashPolicy:
    window: int = 50
    min_requests: int = 20
    limit: float = 0.6
    cool_off_s: float = 60.0


class ThrashGuard:
    def __init__(self, policy: ThrashPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._outcomes: dict[str, deque[bool]] = {}
        self._cooling_until: dict[str, float] = {}
        self.trips: Counter[str] = Counter()

    def is_cooling(self, route: str) -> bool:
        """True while `route` should start one rung higher."""
        until = self._cooling_until.get(route)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self._cooling_until[route]  # recovered: judge the cheap rung afresh
        self._outcomes.pop(route, None)
        return False

    def record(self, route: str, escalated: bool) -> None:
        """One judged request that started at `route` (not those the guard itself moved up)."""
        outcomes = self._outcomes.setdefault(route, deque(maxlen=self.policy.window))
        outcomes.append(escalated)
        if len(outcomes) >= self.policy.min_requests and sum(outcomes) / len(outcomes) > self.policy.limit:
            self._cooling_until[route] = self.clock() + self.policy.cool_off_s
            self.trips[route] += 1
            outcomes.clear()

    def escalation_rate(self, route: str) -> float | None:
        outcomes = self._outcomes.get(route)
        return sum(outcomes) / len(outcomes) if outcomes else None

    def cooling_routes(self) -> list[str]:
        return [route for route in list(self._cooling_until) if self.is_cooling(route)]
