"""SQLite only: the ledger file the proxy wrote before this schema is adopted in place."""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from switchyard.billing.store import StoreUnavailable, migrations, open_database
from tests.unit.billing.test_store import DAY1, usage

_OLD_COLUMNS = (
    "request_id TEXT NOT NULL, attempt INTEGER NOT NULL, model TEXT NOT NULL, backend TEXT NOT NULL, "
    "status TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, "
    "cost_usd REAL NOT NULL, is_estimated INTEGER NOT NULL, started_at REAL NOT NULL, duration_ms REAL NOT NULL, "
    "error TEXT"
)


def write_old_ledger(path: Path, *, has_team: bool) -> None:
    team = ", team TEXT" if has_team else ""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(f"CREATE TABLE usage ({_OLD_COLUMNS}{team}, PRIMARY KEY (request_id, attempt))")
        db.execute("CREATE INDEX usage_started_at ON usage (started_at)")
        rows = [
            ("old", 1, "small", "b", "completed", 10, 5, 0.5, 0, DAY1, 1.0, None, "search"),
            ("old", 2, "large", "b", "failed", 10, 0, 0.25, 1, DAY1, 1.0, "boom", "search"),
        ]
        width = 13 if has_team else 12
        db.executemany(f"INSERT INTO usage VALUES ({', '.join('?' * width)})", [r[:width] for r in rows])


@pytest.mark.parametrize("has_team", [True, False])
async def test_an_old_ledger_file_keeps_its_rows_and_gains_the_daily_aggregate(tmp_path: Path, has_team: bool) -> None:
    path = tmp_path / "usage.sqlite3"
    write_old_ledger(path, has_team=has_team)
    database = await open_database(f"sqlite:///{path}")
    team = "search" if has_team else None
    old = await database.read_usage(request_id="old")
    assert [(r.attempt, r.team, r.is_estimated, r.error, r.is_hedge, r.key_id) for r in old] == [
        (1, team, False, None, False, None),
        (2, team, True, "boom", False, None),
    ]
    assert await database.insert_usage([usage("new", team=team)]) == 1
    day = dt.date(2026, 11, 20)
    summary = await database.usage_summary(day, day, group_by=None, team="search" if has_team else "")
    assert (summary["requests"], summary["cost_usd"], summary["prompt_tokens"]) == (2, pytest.approx(1.0), 30)
    await database.aclose()
    again = await open_database(f"sqlite:///{path}")  # a second start migrates nothing
    assert len(await again.read_usage()) == 3
    await again.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db:
        every = [(version,) for version in range(1, len(migrations.SQLITE) + 1)]
        assert db.execute("SELECT version FROM schema_migrations").fetchall() == every
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_new_file_gets_its_folders_and_a_file_out_of_reach_is_unavailable(tmp_path: Path) -> None:
    database = await open_database(f"sqlite:///{tmp_path / 'a' / 'b' / 'usage.db'}")
    assert await database.insert_usage([usage("r1")]) == 1
    await database.aclose()
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreUnavailable, match="cannot create its folder"):
        await open_database(f"sqlite:///{tmp_path / 'file' / 'usage.db'}")
