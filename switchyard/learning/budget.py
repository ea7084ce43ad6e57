"""The platform's own daily budget for shadow and judge calls (`shadow.budget_usd_per_day`, per UTC
day), never a team's.

Each process counts what its shadow calls cost today, starting from what the ledger held for the
day when it first looked (so a restart does not hand out the day's budget again).
"""

from __future__ import annotations

import datetime as dt
import time

from switchyard.billing.store import Database


def utc_day_start(now: float) -> float:
    day = dt.datetime.fromtimestamp(now, dt.UTC).date()
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


class ShadowBudget:
    def __init__(self, usd_per_day: float, database: Database | None) -> None:
        self.usd_per_day = usd_per_day
        self.database = database
        self._day_start: float | None = None
        self.spent_usd = 0.0

    async def remaining_usd(self) -> float:
        day_start = utc_day_start(time.time())
        if self._day_start != day_start:
            self._day_start, self.spent_usd = day_start, await self._spent_since(day_start)
        return self.usd_per_day - self.spent_usd

    def charge(self, cost_usd: float) -> None:
        self.spent_usd += cost_usd

    async def _spent_since(self, since: float) -> float:
        if self.database is None:
            return 0.0
        ((spent,),) = await self.database.fetch(
            "SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE is_shadow AND started_at >= ?", since
        )
        return float(spent)
