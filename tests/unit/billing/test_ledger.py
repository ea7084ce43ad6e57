"""The ledger writer on SQLite and PostgreSQL alike: nothing lost, nothing counted twice, never dead.

The outage tests stop the real server (PostgreSQL) or hold SQLite's write lock longer than its
busy timeout: on main, either killed the writer task for good and lost every later record.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from switchyard.billing.ledger import LedgerWriter
from switchyard.billing.store import Database, open_database
from switchyard.billing.store.base import sqlite_path
from tests.servers.postgres import PostgresServer, database_url, postgres_server, postgres_url  # noqa: F401
from tests.unit.billing.test_store import DAY1, usage

DAY = dt.date(2026, 11, 20)


async def eventually(predicate: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Wait (polling the event loop) until `predicate()` holds; fail the test if it never does."""
    async with asyncio.timeout(timeout_s):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:  # noqa: F811
    database = await open_database(database_url)
    yield database
    await database.aclose()


def writer_for(database: Database, tmp_path: Path, **options) -> LedgerWriter:
    options = {"flush_interval_s": 0.05, "max_backoff_s": 0.5} | options
    return LedgerWriter(database, tmp_path / "spill" / "ledger.jsonl", **options)


async def totals(database: Database) -> tuple[int, int, float]:
    """(rows, requests in the daily aggregate, cost in it): a row counted twice shows in the last two."""
    summary = await database.usage_summary(DAY, DAY, group_by=None, team=None)
    return await database.count_usage(None, None, None), summary["requests"], round(summary["cost_usd"], 6)


async def test_records_are_written_in_batches(database: Database, tmp_path: Path) -> None:
    writer = writer_for(database, tmp_path, batch_size=3)
    await writer.start()
    records = [usage(f"r{i}", started_at=DAY1 - i) for i in range(10)]
    for record in records:
        writer.record(record)
    assert writer.status().pending == 10
    await writer.flush()
    status = writer.status()
    assert (status.pending, status.spilled, status.is_behind, status.last_error) == (0, 0, False, None)
    assert status.last_written_at is not None
    assert await writer.read() == list(reversed(records))
    await writer.aclose()


async def test_a_second_record_with_the_same_key_never_replaces_the_first(database: Database, tmp_path: Path) -> None:
    writer = writer_for(database, tmp_path)
    await writer.start()
    writer.record(usage("r1", team="a", client_request_id="shared"))
    await writer.flush()
    writer.record(usage("r1", team="b", client_request_id="shared", cost_usd=9.0))
    writer.record(usage("r2", team="b", client_request_id="shared"))
    await writer.aclose()
    rows = await database.read_usage(client_request_id="shared")
    assert [(r.request_id, r.team, r.cost_usd) for r in rows] == [("r1", "a", 0.25), ("r2", "b", 0.25)]


async def test_a_spill_file_left_by_an_earlier_run_is_replayed_once(database: Database, tmp_path: Path) -> None:
    await database.insert_usage([usage("r0")])  # written before that run crashed: its spill repeats it
    writer = writer_for(database, tmp_path, batch_size=3)  # replayed in two batches
    writer.spill_path.parent.mkdir()
    lines = [json.dumps(dataclasses.asdict(usage(f"r{i}"))) for i in range(4)]
    writer.spill_path.write_text("\n".join(lines) + '\n{"request_id": "cut sh')  # the crash cut the last line
    await writer.start()
    assert writer.status().spilled == 4
    await eventually(lambda: writer.status().spilled == 0)
    await writer.aclose()
    assert await totals(database) == (4, 4, 1.0)
    assert list(writer.spill_path.parent.iterdir()) == []


async def test_a_record_the_database_refuses_is_set_apart_and_holds_nothing_back(
    database: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = writer_for(database, tmp_path)
    await writer.start()
    for record in (usage("r1"), usage("bad", cost_usd=float("nan")), usage("r2")):
        writer.record(record)
    await writer.aclose()
    assert [r.request_id for r in await database.read_usage()] == ["r1", "r2"]
    assert not writer.status().is_behind
    rejected = writer.spill_path.with_name(writer.spill_path.name + ".rejected").read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in rejected] == ["bad"]
    assert any("refused bad/1" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


async def test_a_record_after_close_is_written_at_the_next_start(database: Database, tmp_path: Path) -> None:
    writer = writer_for(database, tmp_path)
    await writer.start()
    await writer.aclose()
    writer.record(usage("late"))  # a request that outlived the drain
    assert writer.spill_path.exists()
    assert await database.read_usage(request_id="late") == []
    again = writer_for(database, tmp_path)
    await again.start()
    await eventually(lambda: again.status().spilled == 0)
    await again.aclose()
    assert await database.read_usage(request_id="late") == [usage("late")]


@pytest.fixture
async def pg_database(postgres_url: str) -> AsyncIterator[Database]:  # noqa: F811
    # generous: a slow answer on a busy machine is not an outage (a stopped server refuses at once)
    database = await open_database(postgres_url, command_timeout_s=30.0)
    yield database
    await database.aclose()


async def test_postgres_stopped_then_started_loses_nothing_and_doubles_nothing(
    pg_database: Database,
    postgres_server: PostgresServer,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="switchyard.ledger")
    writer = writer_for(pg_database, tmp_path)
    await writer.start()
    try:
        for i in range(30):
            writer.record(usage(f"before{i}"))
        await writer.flush()
        await asyncio.to_thread(postgres_server.stop)
        for i in range(30):
            writer.record(usage(f"during{i}"))
            await asyncio.sleep(0.01)
        await eventually(lambda: writer.status().spilled >= 30 and writer.status().pending == 0)
        status = writer.status()
        assert status.is_behind and status.last_error is not None
    finally:
        await asyncio.to_thread(postgres_server.start)
    for i in range(30):
        writer.record(usage(f"after{i}"))
    await eventually(lambda: not writer.status().is_behind and writer.status().pending == 0)
    await writer.aclose()
    assert await totals(pg_database) == (90, 90, 22.5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "writing to postgresql://" in errors[0].getMessage()
    assert "records go to" in errors[0].getMessage()
    assert any("again after" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


async def test_closing_while_postgres_is_down_spills_and_the_next_start_writes_it(
    pg_database: Database,
    postgres_server: PostgresServer,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="switchyard.ledger")
    writer = writer_for(pg_database, tmp_path)
    writer.remind_every_s = 0.0  # every failure after the first reminds
    await writer.start()
    await asyncio.to_thread(postgres_server.stop)
    try:
        for i in range(20):
            writer.record(usage(f"r{i}"))
            if i in (4, 9):
                await writer.flush()  # fails: spilled
        await writer.aclose()  # bounded by close_timeout_s (and the command timeout): never hangs
        assert writer.status().pending == 0 and writer.status().spilled == 20
    finally:
        await asyncio.to_thread(postgres_server.start)
    again = writer_for(pg_database, tmp_path)
    await again.start()
    await eventually(lambda: again.status().spilled == 0)
    await again.aclose()
    assert await totals(pg_database) == (20, 20, 5.0)
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 3 and "failed" in failures[0]
    assert all("still failing" in message for message in failures[1:])


async def test_a_hung_postgres_fails_the_write_after_the_command_timeout_and_the_writer_catches_up(
    postgres_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    import asyncpg

    database = await open_database(postgres_url, command_timeout_s=0.5)
    writer = writer_for(database, tmp_path)
    await writer.start()
    blocker = await asyncpg.connect(postgres_url)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("LOCK TABLE usage IN ACCESS EXCLUSIVE MODE")  # every insert now waits
        writer.record(usage("r1"))
        await eventually(lambda: writer.status().spilled == 1)
        assert "TimeoutError" in (writer.status().last_error or "")
        await transaction.rollback()
    finally:
        await blocker.close()
    writer.record(usage("r2"))
    await eventually(lambda: not writer.status().is_behind and writer.status().pending == 0)
    await writer.aclose()
    await database.aclose()
    checker = await open_database(postgres_url, command_timeout_s=30.0)  # not the 0.5 s one: no hang to cut here
    try:
        assert await totals(checker) == (2, 2, 0.5)
    finally:
        await checker.aclose()


async def test_closing_gives_up_on_a_hung_write_and_spills_it(postgres_url: str, tmp_path: Path) -> None:  # noqa: F811
    import asyncpg

    database = await open_database(postgres_url, command_timeout_s=600.0)
    writer = writer_for(database, tmp_path, close_timeout_s=0.3)
    await writer.start()
    blocker = await asyncpg.connect(postgres_url)
    try:
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE usage IN ACCESS EXCLUSIVE MODE")
            writer.record(usage("r1"))
            await eventually(lambda: writer.status().pending == 0)  # taken by the writer task, which now waits
            async with asyncio.timeout(60):  # only bounds a hang, far below the command timeout
                await writer.aclose()
            # spilled by aclose() cutting the write short, not by the command timeout
            assert writer.status().last_error == "TimeoutError: no answer before the ledger closed"
            assert writer.status().spilled == 1
    finally:
        await blocker.close()
    again = writer_for(database, tmp_path)
    await again.start()
    await eventually(lambda: again.status().spilled == 0)
    await again.aclose()
    assert await totals(database) == (1, 1, 0.25)
    await database.aclose()


@pytest.mark.slow
async def test_a_sqlite_lock_held_for_12_s_does_not_kill_the_writer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    database = await open_database(url, command_timeout_s=2.0)
    writer = writer_for(database, tmp_path)
    await writer.start()
    locked, seen_behind = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        """A long report's read transaction, and a writer holding the lock, for 12 s (several busy
        timeouts) and in any case until the test has seen the writer fall behind."""
        with contextlib.closing(sqlite3.connect(sqlite_path(url), isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT COUNT(*) FROM usage").fetchone()
            with contextlib.closing(sqlite3.connect(sqlite_path(url), isolation_level=None)) as other:
                other.execute("BEGIN IMMEDIATE")
                locked.set()
                time.sleep(12)
                seen_behind.wait(60)
                other.execute("ROLLBACK")
            reader.execute("COMMIT")

    holder = asyncio.create_task(asyncio.to_thread(hold_the_lock))
    await asyncio.to_thread(locked.wait)
    for i in range(40):
        writer.record(usage(f"r{i}"))
        await asyncio.sleep(0.05)  # requests keep coming during the outage
    try:
        await eventually(lambda: writer.status().is_behind)
    finally:
        seen_behind.set()
    await holder
    await eventually(lambda: not writer.status().is_behind and writer.status().pending == 0)
    writer.record(usage("after"))
    await writer.aclose()
    assert await totals(database) == (41, 41, 10.25)
    await database.aclose()
