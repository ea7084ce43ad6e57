"""The usage ledger: one record per attempt at a backend, linked by request id.

Records are queued on the event loop (an append) and written by a background task in batches on
a worker thread, so metering never blocks a request. SQLite by default; the `Ledger` protocol is
what a PostgreSQL ledger will implement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Protocol

STATUSES = ("completed", "cancelled", "failed", "escalated")


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    attempt: int  # 1, 2, … in the order they were made
    model: str  # the public model name that was tried
    backend: str  # the deployment that took it
    status: str  # completed | cancelled | failed | escalated (judged by the cascade, not sent)
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    is_estimated: bool  # token counts estimated (no usage from the upstream)
    started_at: float  # unix seconds
    duration_ms: float
    error: str | None = None
    team: str | None = None  # the calling team, when teams are configured


class Ledger(Protocol):
    def record(self, record: UsageRecord) -> None: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def spend_since(self, since: float) -> dict[str, float]:
        """USD per team over the attempts started at or after `since` (unix seconds)."""
        ...


logger = logging.getLogger("switchyard.ledger")

_COLUMNS = [f.name for f in fields(UsageRecord)]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    request_id TEXT NOT NULL, attempt INTEGER NOT NULL, model TEXT NOT NULL, backend TEXT NOT NULL,
    status TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL, is_estimated INTEGER NOT NULL, started_at REAL NOT NULL, duration_ms REAL NOT NULL,
    error TEXT, team TEXT,
    PRIMARY KEY (request_id, attempt)
);
CREATE INDEX IF NOT EXISTS usage_started_at ON usage (started_at);
"""
# Columns added since the first schema, in order: a ledger file written before them gets them at start.
_ADDED_COLUMNS = {"team": "TEXT"}


class SQLiteLedger:
    def __init__(self, path: str | Path, flush_interval_s: float = 0.2) -> None:
        self.path = Path(path).expanduser()
        self.flush_interval_s = flush_interval_s
        self._pending: list[UsageRecord] = []
        self._writer: asyncio.Task | None = None
        self._closing = asyncio.Event()
        self._is_closed = False

    def record(self, record: UsageRecord) -> None:
        if self._is_closed:  # metered after the last flush (a request that outlived the drain)
            logger.warning("ledger record for %s after close: written at once", record.request_id)
            self._insert([record])
            return
        self._pending.append(record)

    async def start(self) -> None:
        await asyncio.to_thread(self._create)
        self._writer = asyncio.create_task(self._write_forever())

    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(self.path)) as db, db:
            db.executescript(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
            db.execute("CREATE INDEX IF NOT EXISTS usage_team_started_at ON usage (team, started_at)")

    async def _write_forever(self) -> None:
        """Flush every `flush_interval_s` until closing; never cancelled half-way through a batch."""
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            await asyncio.to_thread(self._insert, batch)

    def _insert(self, batch: list[UsageRecord]) -> None:
        placeholders = ", ".join("?" for _ in _COLUMNS)
        with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db, db:
            db.executemany(f"INSERT OR REPLACE INTO usage VALUES ({placeholders})", [astuple(r) for r in batch])

    def read(self, request_id: str | None = None) -> list[UsageRecord]:
        """Blocking; for reports and tests."""
        query, args = "SELECT * FROM usage", ()
        if request_id is not None:
            query, args = query + " WHERE request_id = ?", (request_id,)
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            rows = db.execute(query + " ORDER BY started_at, attempt", args).fetchall()
        return [UsageRecord(*row[:8], bool(row[8]), *row[9:]) for row in rows]

    async def spend_since(self, since: float) -> dict[str, float]:
        return await asyncio.to_thread(self._spend_since, since)

    def _spend_since(self, since: float) -> dict[str, float]:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            rows = db.execute(
                "SELECT team, SUM(cost_usd) FROM usage WHERE team IS NOT NULL AND started_at >= ? GROUP BY team",
                (since,),
            ).fetchall()
        return {team: float(total) for team, total in rows}

    async def aclose(self) -> None:
        """Write everything pending; records that arrive later are written as they come."""
        self._closing.set()
        if self._writer is not None:
            await self._writer
            self._writer = None
        await self.flush()
        self._is_closed = True


def now() -> float:
    return time.time()
