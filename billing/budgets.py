"""Spend against daily budgets: what each team has spent today (UTC), kept in this process.

Every metered attempt adds its cost (completed, cancelled, failed and escalated alike: what the
upstream was paid for). At start the day so far is read back from the usage ledger, so a restart
forgets nothing. One proxy process owns the counts; several replicas behind a load balancer
would each see only their own share (a shared store is the billing issue's to add).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict

from switchyard.billing.teams import Team


def utc_day(at: float) -> dt.date:
    return dt.datetime.fromtimestamp(at, dt.UTC).date()


def start_of_utc_day(at: float) -> float:
    day = utc_day(at)
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def seconds_to_next_utc_day(at: float) -> float:
    return start_of_utc_day(at) + 86_400 - at


class SpendTracker:
    def __init__(self) -> None:
        self._spent: dict[tuple[str, dt.date], float] = defaultdict(float)

    def add(self, team: str, cost_usd: float, at: float | None = None) -> None:
        if cost_usd:
            self._spent[(team, utc_day(time.time() if at is None else at))] += cost_usd

    def spent_today(self, team: str, at: float | None = None) -> float:
        return self._spent.get((team, utc_day(time.time() if at is None else at)), 0.0)

    def headroom_usd(self, team: Team | None, at: float | None = None) -> float | None:
        """What the team may still spend today; None when it has no budget (or there is no team)."""
        if team is None or team.budget_usd_per_day is None:
            return None
        return team.budget_usd_per_day - self.spent_today(team.name, at)
