from __future__ import annotations

from switchyard.cascade.thrash import ThrashGuard, ThrashPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_trips_past_the_limit_and_recovers_after_the_cool_off():
    clock = Clock()
    guard = ThrashGuard(ThrashPolicy(window=10, min_requests=5, limit=0.6, cool_off_s=30), clock)
    for escalated in (True, False, True, True):
        guard.record("small", escalated)
    assert not guard.is_cooling("small")  # 4 < min_requests
    guard.record("small", True)  # 4 of 5 = 80% > 60%
    assert guard.is_cooling("small") and guard.trips["small"] == 1
    assert not guard.is_cooling("large")
    clock.now = 29.9
    assert guard.is_cooling("small")
    clock.now = 30.0
    assert not guard.is_cooling("small")
    assert guard.escalation_rate("small") is None  # a fresh window after recovery


def test_at_the_limit_it_does_not_trip():
    guard = ThrashGuard(ThrashPolicy(window=10, min_requests=5, limit=0.6), Clock())
    for escalated in (True, True, True, False, False):
        guard.record("small", escalated)
    assert not guard.is_cooling("small") and guard.escalation_rate("small") == 0.6


def test_the_window_slides():
    guard = ThrashGuard(ThrashPolicy(window=4, min_requests=4, limit=0.5), Clock())
    for escalated in (True, True, False, False, False, False):
        guard.record("small", escalated)
    assert guard.escalation_rate("small") == 0.0
