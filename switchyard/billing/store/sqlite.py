"""The SQLite database: sqlite3 on a worker thread of its own, WAL, a busy timeout.

One connection, kept open on that thread. A connection opened and closed for every call made SQLite
checkpoint its WAL into the database file at each close (the last connection to a WAL database
does): that was most of what metering cost per request. A connection that fails with an error that
may pass (busy, locked, out of reach, disk full) is closed; the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from switchyard.billing.records import UsageRecord
from switchyard.billing.store import migrations
from switchyard.billing.store.errors import StoreConflict, StoreError, StoreNotFound, StoreUnavailable
from switchyard.billing.store.schema import (
    KEY_COLUMNS,
    TEAM_COLUMNS,
    USAGE_COLUMNS,
    after_earlier,
    check_team_changes,
    day_bounds,
    key_from_row,
    models_to_text,
    summary,
    summary_query,
    team_from_row,
    team_values,
    usage_from_row,
    usage_values,
)
from switchyard.billing.teams import ApiKey, Team, issue_key

T = TypeVar("T")
# Worth retrying later: busy or locked beyond the busy timeout, the file out of reach or the disk full.
_UNAVAILABLE = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
}
_USAGE = ", ".join(USAGE_COLUMNS)
_USAGE_ROW = f"({', '.join('?' for _ in USAGE_COLUMNS)})"
# Many rows a statement: sqlite3 lets go of the GIL around each step of a statement, and with a row a
# step (executemany) the writer thread and the event loop handed the GIL back and forth for every
# record (at 1,300 records a second, 1.5 ms of wall time and 24 us of CPU a row, against 9 us).
# At most 32766 parameters a statement (SQLite's limit).
_ROWS_PER_INSERT = 32766 // len(USAGE_COLUMNS)


@functools.lru_cache(maxsize=64)
def _insert_usage(num_rows: int) -> str:
    # Not INSERT OR IGNORE: that would also drop, silently, a row breaking a NOT NULL constraint.
    rows = ", ".join([_USAGE_ROW] * num_rows)
    return f"INSERT INTO usage ({_USAGE}) VALUES {rows} ON CONFLICT (request_id, attempt) DO NOTHING"


_KEYS = ", ".join(KEY_COLUMNS)
_TEAMS = ", ".join(TEAM_COLUMNS)


class SQLiteDatabase:
    dialect = "sqlite"

    def __init__(self, path: Path, busy_timeout_s: float) -> None:
        self.path = path
        self.display_url = f"sqlite:///{path}"
        self.busy_timeout_s = busy_timeout_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-sqlite")
        self._db: sqlite3.Connection | None = None  # used on that thread only

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float) -> SQLiteDatabase:
        database = cls(path, busy_timeout_s)
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"{database.display_url}: cannot create its folder: {exc}") from exc
        await database._call(database._migrate)
        return database

    async def aclose(self) -> None:
        """Close the connection once what its thread is doing is done (never waiting on a hung call)."""
        self._thread.submit(self._disconnect)
        self._thread.shutdown(wait=False)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)

    def _disconnect(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._call_blocking, work)

    def _call_blocking(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._db is None:
                self._db = self._connect()
            return work(self._db)
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _UNAVAILABLE:  # the primary code of an extended one
                self._disconnect()
                raise StoreUnavailable(f"{self.display_url}: {exc}") from exc
            raise StoreError(f"{self.display_url}: {exc}") from exc

    def _enable_wal(self, db: sqlite3.Connection) -> None:
        """Switching a new file to WAL does not wait on the busy timeout when another connection is
        doing the same (two proxies starting together): wait for it here, up to that timeout."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    @staticmethod
    def _write(db: sqlite3.Connection, work: Callable[[], T]) -> T:
        """`work` in one transaction that holds the write lock from its start."""
        db.execute("BEGIN IMMEDIATE")
        try:
            result = work()
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    def _migrate(self, db: sqlite3.Connection) -> None:
        self._enable_wal(db)

        def apply() -> None:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL)")
            (done,) = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            for version, migration in enumerate(migrations.SQLITE, start=1):
                if version > done:
                    migration(db)
                    db.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))

        self._write(db, apply)

    # the ledger

    async def insert_usage(self, records: Sequence[UsageRecord]) -> int:
        rows = [usage_values(r) for r in records]

        def insert(db: sqlite3.Connection) -> int:
            # rowcount is each statement's own changes: a row already there adds 0, the trigger's none
            def insert_all() -> int:
                num_inserted = 0
                for start in range(0, len(rows), _ROWS_PER_INSERT):
                    part = rows[start : start + _ROWS_PER_INSERT]
                    values = [value for row in part for value in row]
                    num_inserted += db.execute(_insert_usage(len(part)), values).rowcount
                return num_inserted

            return self._write(db, insert_all)

        return await self._call(insert) if rows else 0

    async def spend_since(self, since: float) -> dict[tuple[str, str], float]:
        query = (
            "SELECT 'team', team, SUM(cost_usd) FROM usage WHERE team IS NOT NULL AND NOT is_shadow "
            "AND started_at >= ? GROUP BY team "
            "UNION ALL "
            "SELECT 'key', key_id, SUM(cost_usd) FROM usage WHERE key_id IS NOT NULL AND NOT is_shadow "
            "AND started_at >= ? "
            "GROUP BY key_id"
        )
        rows = await self._call(lambda db: db.execute(query, (since, since)).fetchall())
        return {(kind, name): float(total) for kind, name, total in rows}

    async def usage_summary(
        self, start: dt.date, end: dt.date, *, group_by: str | None, team: str | None
    ) -> dict[str, Any]:
        query, reads_attempts = summary_query(group_by, has_team=team is not None)
        args: list[float | str] = [*day_bounds(start, end)] if reads_attempts else [start.isoformat(), end.isoformat()]
        if team is not None:
            args.append(team)
        rows = await self._call(lambda db: db.execute(query, args).fetchall())
        return summary(start, end, group_by, team, rows)

    async def usage_teams(self) -> list[str]:
        query = "SELECT DISTINCT team FROM usage_daily WHERE team <> '' ORDER BY team"
        return [team for (team,) in await self._call(lambda db: db.execute(query).fetchall())]

    async def count_usage(self, since: float | None, until: float | None, team: str | None) -> int:
        where, args = _usage_filter(since, until, team)
        (count,) = await self._call(lambda db: db.execute(f"SELECT COUNT(*) FROM usage WHERE {where}", args).fetchone())
        return int(count)

    async def iter_usage(
        self, since: float | None, until: float | None, team: str | None, batch_size: int = 5000
    ) -> AsyncIterator[list[UsageRecord]]:
        where, args = _usage_filter(since, until, team)
        after: tuple[float, str, int] | tuple[()] = ()
        while True:
            page_where = where + (" AND (started_at, request_id, attempt) > (?, ?, ?)" if after else "")
            query = (
                f"SELECT {_USAGE} FROM usage WHERE {page_where} "
                f"ORDER BY started_at, request_id, attempt LIMIT {int(batch_size)}"
            )
            page_args = [*args, *after]
            rows = await self._call(functools.partial(_fetch_all, query=query, args=page_args))
            if not rows:
                return
            batch = [usage_from_row(row) for row in rows]
            yield batch
            last = batch[-1]
            after = (last.started_at, last.request_id, last.attempt)

    async def read_usage(
        self, *, request_id: str | None = None, client_request_id: str | None = None
    ) -> list[UsageRecord]:
        where = "1 = 1"
        args: list[str] = []
        if request_id is not None:
            where, args = where + " AND request_id = ?", [*args, request_id]
        if client_request_id is not None:
            where, args = where + " AND client_request_id = ?", [*args, client_request_id]
        query = f"SELECT {_USAGE} FROM usage WHERE {where} ORDER BY started_at, request_id, attempt"
        rows = await self._call(lambda db: db.execute(query, args).fetchall())
        return [usage_from_row(row) for row in rows]

    # plain statements

    async def execute(self, sql: str, *args: Any) -> int:
        return await self._call(lambda db: db.execute(sql, args).rowcount)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._call(lambda db: self._write(db, lambda: db.executemany(sql, rows)))

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return await self._call(lambda db: db.execute(sql, args).fetchall())

    async def insert_usage_with(
        self, records: Sequence[UsageRecord], statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[tuple[Any, ...]]]:
        def write(db: sqlite3.Connection) -> list[list[tuple[Any, ...]]]:
            def both() -> list[list[tuple[Any, ...]]]:  # under BEGIN IMMEDIATE: no other writer reads between
                before = {
                    request_id: db.execute(
                        "SELECT COALESCE(MAX(attempt), 0) FROM usage WHERE request_id = ?", (request_id,)
                    ).fetchone()[0]
                    for request_id in {r.request_id for r in records}
                }
                rows = [usage_values(after_earlier(r, before)) for r in records]
                for start in range(0, len(rows), _ROWS_PER_INSERT):
                    part = rows[start : start + _ROWS_PER_INSERT]
                    db.execute(_insert_usage(len(part)), [value for row in part for value in row])
                return [db.execute(sql, tuple(args)).fetchall() for sql, args in statements]

            return self._write(db, both)

        return await self._call(write)

    # teams and keys

    async def directory_version(self) -> int:
        (version,) = await self._call(lambda db: db.execute("SELECT version FROM directory_version").fetchone())
        return int(version)

    async def load_directory(self) -> tuple[list[Team], list[ApiKey]]:
        def load(db: sqlite3.Connection) -> tuple[list[Team], list[ApiKey]]:
            db.execute("BEGIN")
            try:
                teams = db.execute(f"SELECT {_TEAMS} FROM teams ORDER BY name").fetchall()
                keys = db.execute(f"SELECT {_KEYS} FROM api_keys ORDER BY created_at, id").fetchall()
            finally:
                db.execute("COMMIT")
            return [team_from_row(r) for r in teams], [key_from_row(r) for r in keys]

        return await self._call(load)

    async def create_team(self, team: Team) -> None:
        def create(db: sqlite3.Connection) -> None:
            try:
                db.execute(
                    f"INSERT INTO teams ({_TEAMS}, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (*team_values(team), time.time()),
                )
            except sqlite3.IntegrityError as exc:
                raise StoreConflict(f"a team named {team.name!r} exists already") from exc
            _bump(db)

        await self._call(lambda db: self._write(db, lambda: create(db)))

    async def update_team(self, name: str, **changes: Any) -> Team:
        check_team_changes(changes)
        if "models" in changes:
            models = changes["models"]
            changes["models"] = models_to_text(None if models is None else frozenset(models))

        def update(db: sqlite3.Connection) -> Team:
            if changes:
                assignments = ", ".join(f"{column} = ?" for column in changes)
                db.execute(f"UPDATE teams SET {assignments} WHERE name = ?", (*changes.values(), name))
            row = db.execute(f"SELECT {_TEAMS} FROM teams WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise StoreNotFound(f"no team named {name!r} in the database")
            _bump(db)
            return team_from_row(row)

        return await self._call(lambda db: self._write(db, lambda: update(db)))

    async def list_teams(self) -> list[Team]:
        return (await self.load_directory())[0]

    async def create_key(
        self,
        team: str,
        *,
        budget_usd_per_day: float | None = None,
        budget_usd_per_month: float | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: float | None = None,
    ) -> tuple[str, ApiKey]:
        key, api_key = issue_key(
            team,
            budget_usd_per_day=budget_usd_per_day,
            budget_usd_per_month=budget_usd_per_month,
            rpm=rpm,
            tpm=tpm,
            expires_at=expires_at,
        )
        values = tuple(getattr(api_key, column) for column in KEY_COLUMNS)

        def create(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT INTO api_keys ({_KEYS}) VALUES ({', '.join('?' for _ in KEY_COLUMNS)})", values)
            _bump(db)

        await self._call(lambda db: self._write(db, lambda: create(db)))
        return key, api_key

    async def list_keys(self, team: str | None = None) -> list[ApiKey]:
        keys = (await self.load_directory())[1]
        return [k for k in keys if team is None or k.team == team]

    async def revoke_key(self, key_id: str) -> ApiKey:
        def revoke(db: sqlite3.Connection) -> ApiKey:
            db.execute("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?", (time.time(), key_id))
            row = db.execute(f"SELECT {_KEYS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
            if row is None:
                raise StoreNotFound(f"no key with id {key_id!r}")
            _bump(db)
            return key_from_row(row)

        return await self._call(lambda db: self._write(db, lambda: revoke(db)))


def _bump(db: sqlite3.Connection) -> None:
    db.execute("UPDATE directory_version SET version = version + 1")


def _fetch_all(db: sqlite3.Connection, query: str, args: Sequence[object]) -> list[Any]:
    return db.execute(query, args).fetchall()


def _usage_filter(since: float | None, until: float | None, team: str | None) -> tuple[str, list[float | str]]:
    where = "1 = 1"
    args: list[float | str] = []
    if since is not None:
        where, args = where + " AND started_at >= ?", [*args, since]
    if until is not None:
        where, args = where + " AND started_at < ?", [*args, until]
    if team is not None:
        where, args = where + " AND team = ?", [*args, team]
    return where, args
