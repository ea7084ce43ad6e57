"""The PostgreSQL database: an asyncpg pool (small), every command bounded by a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

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
)
from switchyard.billing.teams import ApiKey, Team, issue_key
from switchyard.core.urls import mask_password

_MIGRATION_LOCK = 0x5357_4C45_4447  # pg_advisory_xact_lock key: "SWLEDG"
_UNAVAILABLE = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # the server is shutting down
    asyncpg.exceptions.QueryCanceledError,
)
_USAGE = ", ".join(USAGE_COLUMNS)
_KEYS = ", ".join(KEY_COLUMNS)
_TEAMS = ", ".join(TEAM_COLUMNS)


def _numbered(sql: str) -> str:
    """`?` placeholders (SQLite's, the callers' own) as PostgreSQL's `$1`, `$2`, …"""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], start=1))


class PostgresDatabase:
    dialect = "postgresql"

    def __init__(self, url: str, pool: asyncpg.Pool, command_timeout_s: float) -> None:
        self.display_url = mask_password(url)
        self.command_timeout_s = command_timeout_s
        self._pool = pool

    @classmethod
    async def open(cls, url: str, *, command_timeout_s: float) -> PostgresDatabase:
        try:
            pool = await asyncpg.create_pool(
                url, min_size=1, max_size=4, command_timeout=command_timeout_s, timeout=command_timeout_s
            )
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"{mask_password(url)}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"{mask_password(url)}: {exc}") from exc
        database = cls(url, pool, command_timeout_s)
        try:
            await database._migrate()
        except BaseException:
            await database.aclose()
            raise
        return database

    async def aclose(self) -> None:
        try:
            await asyncio.wait_for(self._pool.close(), self.command_timeout_s)
        except TimeoutError:
            self._pool.terminate()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            async with self._pool.acquire(timeout=self.command_timeout_s) as connection:
                yield connection
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"{self.display_url}: {type(exc).__name__}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"{self.display_url}: {exc}") from exc

    async def _migrate(self) -> None:
        async with self._connection() as db, db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)"
            )
            done = await db.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
            for version, script in enumerate(migrations.POSTGRES, start=1):
                if version > done:
                    await db.execute(script)
                    await db.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, time.time())

    # the ledger

    async def insert_usage(self, records: Sequence[UsageRecord]) -> int:
        if not records:
            return 0
        rows = json.dumps([dataclasses.asdict(r) for r in records])
        async with self._connection() as db:
            status = await db.execute(
                "INSERT INTO usage SELECT * FROM jsonb_populate_recordset(NULL::usage, $1::jsonb) "
                "ON CONFLICT (request_id, attempt) DO NOTHING",
                rows,
            )
        return int(status.rsplit(" ", 1)[-1])  # "INSERT 0 <rows>"

    async def spend_since(self, since: float) -> dict[tuple[str, str], float]:
        async with self._connection() as db:
            rows = await db.fetch(
                "SELECT 'team', team, SUM(cost_usd) FROM usage WHERE team IS NOT NULL AND NOT is_shadow "
                "AND started_at >= $1 "
                "GROUP BY team UNION ALL "
                "SELECT 'key', key_id, SUM(cost_usd) FROM usage WHERE key_id IS NOT NULL AND NOT is_shadow "
                "AND started_at >= $1 "
                "GROUP BY key_id",
                since,
            )
        return {(kind, name): float(total) for kind, name, total in rows}

    async def usage_summary(
        self, start: dt.date, end: dt.date, *, group_by: str | None, team: str | None
    ) -> dict[str, Any]:
        query, reads_attempts = summary_query(group_by, has_team=team is not None)
        args: list[dt.date | float | str] = list(day_bounds(start, end)) if reads_attempts else [start, end]
        if team is not None:
            args.append(team)
        async with self._connection() as db:
            rows = await db.fetch(_numbered(query), *args)
        return summary(start, end, group_by, team, [tuple(r) for r in rows])

    async def usage_teams(self) -> list[str]:
        async with self._connection() as db:
            rows = await db.fetch("SELECT DISTINCT team FROM usage_daily WHERE team <> '' ORDER BY team")
        return [row[0] for row in rows]

    async def count_usage(self, since: float | None, until: float | None, team: str | None) -> int:
        where, args = _usage_filter(since, until, team)
        async with self._connection() as db:
            return int(await db.fetchval(f"SELECT COUNT(*) FROM usage WHERE {where}", *args))

    async def iter_usage(
        self, since: float | None, until: float | None, team: str | None, batch_size: int = 5000
    ) -> AsyncIterator[list[UsageRecord]]:
        where, args = _usage_filter(since, until, team)
        after: tuple[float, str, int] | tuple[()] = ()
        while True:
            n = len(args)
            page_where = where + (
                f" AND (started_at, request_id, attempt) > (${n + 1}, ${n + 2}, ${n + 3})" if after else ""
            )
            async with self._connection() as db:
                rows = await db.fetch(
                    f"SELECT {_USAGE} FROM usage WHERE {page_where} "
                    f"ORDER BY started_at, request_id, attempt LIMIT {int(batch_size)}",
                    *args,
                    *after,
                )
            if not rows:
                return
            batch = [usage_from_row(row) for row in rows]
            yield batch
            last = batch[-1]
            after = (last.started_at, last.request_id, last.attempt)

    async def read_usage(
        self, *, request_id: str | None = None, client_request_id: str | None = None
    ) -> list[UsageRecord]:
        where, args = "TRUE", []
        if request_id is not None:
            args.append(request_id)
            where += f" AND request_id = ${len(args)}"
        if client_request_id is not None:
            args.append(client_request_id)
            where += f" AND client_request_id = ${len(args)}"
        async with self._connection() as db:
            rows = await db.fetch(
                f"SELECT {_USAGE} FROM usage WHERE {where} ORDER BY started_at, request_id, attempt", *args
            )
        return [usage_from_row(row) for row in rows]

    # plain statements

    async def execute(self, sql: str, *args: Any) -> int:
        async with self._connection() as db:
            status = await db.execute(_numbered(sql), *args)
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else 0

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        async with self._connection() as db, db.transaction():
            await db.executemany(_numbered(sql), rows)

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        async with self._connection() as db:
            return [tuple(row) for row in await db.fetch(_numbered(sql), *args)]

    async def insert_usage_with(
        self, records: Sequence[UsageRecord], statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[tuple[Any, ...]]]:
        async with self._connection() as db, db.transaction():
            if records:
                before: dict[str, int] = {}
                for request_id in sorted({r.request_id for r in records}):  # locks taken in one order
                    await db.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", request_id)
                    before[request_id] = await db.fetchval(
                        "SELECT COALESCE(MAX(attempt), 0) FROM usage WHERE request_id = $1", request_id
                    )
                await db.execute(
                    "INSERT INTO usage SELECT * FROM jsonb_populate_recordset(NULL::usage, $1::jsonb) "
                    "ON CONFLICT (request_id, attempt) DO NOTHING",
                    json.dumps([dataclasses.asdict(after_earlier(r, before)) for r in records]),
                )
            return [[tuple(row) for row in await db.fetch(_numbered(sql), *args)] for sql, args in statements]

    # teams and keys

    async def directory_version(self) -> int:
        async with self._connection() as db:
            return int(await db.fetchval("SELECT version FROM directory_version"))

    async def load_directory(self) -> tuple[list[Team], list[ApiKey]]:
        async with self._connection() as db, db.transaction(isolation="repeatable_read", readonly=True):
            teams = await db.fetch(f"SELECT {_TEAMS} FROM teams ORDER BY name")
            keys = await db.fetch(f"SELECT {_KEYS} FROM api_keys ORDER BY created_at, id")
        return [team_from_row(r) for r in teams], [key_from_row(r) for r in keys]

    async def create_team(self, team: Team) -> None:
        async with self._connection() as db, db.transaction():
            try:
                await db.execute(
                    f"INSERT INTO teams ({_TEAMS}, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    *team_values(team),
                    time.time(),
                )
            except asyncpg.UniqueViolationError as exc:
                raise StoreConflict(f"a team named {team.name!r} exists already") from exc
            await _bump(db)

    async def update_team(self, name: str, **changes: Any) -> Team:
        check_team_changes(changes)
        if "models" in changes:
            models = changes["models"]
            changes["models"] = models_to_text(None if models is None else frozenset(models))
        async with self._connection() as db, db.transaction():
            if changes:
                assignments = ", ".join(f"{column} = ${i}" for i, column in enumerate(changes, start=2))
                await db.execute(f"UPDATE teams SET {assignments} WHERE name = $1", name, *changes.values())
            row = await db.fetchrow(f"SELECT {_TEAMS} FROM teams WHERE name = $1", name)
            if row is None:
                raise StoreNotFound(f"no team named {name!r} in the database")
            await _bump(db)
        return team_from_row(row)

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
        placeholders = ", ".join(f"${i}" for i in range(1, len(KEY_COLUMNS) + 1))
        async with self._connection() as db, db.transaction():
            await db.execute(
                f"INSERT INTO api_keys ({_KEYS}) VALUES ({placeholders})",
                *(getattr(api_key, column) for column in KEY_COLUMNS),
            )
            await _bump(db)
        return key, api_key

    async def list_keys(self, team: str | None = None) -> list[ApiKey]:
        keys = (await self.load_directory())[1]
        return [k for k in keys if team is None or k.team == team]

    async def revoke_key(self, key_id: str) -> ApiKey:
        async with self._connection() as db, db.transaction():
            row = await db.fetchrow(
                f"UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1 RETURNING {_KEYS}",
                key_id,
                time.time(),
            )
            if row is None:
                raise StoreNotFound(f"no key with id {key_id!r}")
            await _bump(db)
        return key_from_row(row)


async def _bump(db: asyncpg.Connection) -> None:
    await db.execute("UPDATE directory_version SET version = version + 1")


def _usage_filter(since: float | None, until: float | None, team: str | None) -> tuple[str, list[float | str]]:
    where = "TRUE"
    args: list[float | str] = []
    for condition, value in (("started_at >= ", since), ("started_at < ", until), ("team = ", team)):
        if value is not None:
            args.append(value)
            where += f" AND {condition}${len(args)}"
    return where, args
