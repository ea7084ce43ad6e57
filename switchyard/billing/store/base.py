"""The `Database` protocol both dialects implement, and `open_database(url)`."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from switchyard.billing.records import UsageRecord
from switchyard.billing.store.errors import StoreError
from switchyard.billing.teams import ApiKey, Team
from switchyard.core.urls import mask_password

COMMAND_TIMEOUT_S = 5.0  # a down or hung database fails a call after this, never blocks it for long


class Database(Protocol):
    dialect: str  # "sqlite" | "postgresql"
    display_url: str  # the url with any password masked

    async def aclose(self) -> None: ...

    # the ledger
    async def insert_usage(self, records: Sequence[UsageRecord]) -> int:
        """Insert the records not there yet (key: request_id, attempt); return how many were."""
        ...

    async def spend_since(self, since: float) -> dict[tuple[str, str], float]:
        """USD over attempts started at or after `since`: {("team", name): usd, ("key", key_id): usd}
        (shadow calls left out: the platform pays for them, not the team)."""
        ...

    async def usage_summary(
        self, start: dt.date, end: dt.date, *, group_by: str | None, team: str | None
    ) -> dict[str, Any]: ...

    async def usage_teams(self) -> list[str]:
        """The teams the ledger has usage of, by name (a team deleted since included)."""
        ...

    async def count_usage(self, since: float | None, until: float | None, team: str | None) -> int: ...

    def iter_usage(
        self, since: float | None, until: float | None, team: str | None, batch_size: int = 5000
    ) -> AsyncIterator[list[UsageRecord]]: ...

    async def read_usage(
        self, *, request_id: str | None = None, client_request_id: str | None = None
    ) -> list[UsageRecord]: ...

    # plain statements, for the tables of other parts (the batch tier's): `?` placeholders
    async def execute(self, sql: str, *args: Any) -> int:
        """Run one statement (its own transaction); return the rows it changed."""
        ...

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for each row, all in one transaction."""
        ...

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]: ...

    async def insert_usage_with(
        self, records: Sequence[UsageRecord], statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[tuple[Any, ...]]]:
        """Insert the records and run `statements` in the same transaction: the usage of a piece of
        work and what it produced are written together or not at all. Each record's `attempt` is
        taken as counted from the attempts its request already has in the ledger (1: the next one),
        read under a lock on the request, so two runs of one piece of work never collide.
        Returns each statement's rows (RETURNING, SELECT; [] for the others)."""
        ...

    # teams and keys
    async def directory_version(self) -> int: ...

    async def load_directory(self) -> tuple[list[Team], list[ApiKey]]: ...

    async def create_team(self, team: Team) -> None: ...

    async def update_team(self, name: str, **changes: Any) -> Team: ...

    async def list_teams(self) -> list[Team]: ...

    async def create_key(
        self,
        team: str,
        *,
        budget_usd_per_day: float | None = None,
        budget_usd_per_month: float | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: float | None = None,
    ) -> tuple[str, ApiKey]: ...

    async def list_keys(self, team: str | None = None) -> list[ApiKey]: ...

    async def revoke_key(self, key_id: str) -> ApiKey: ...


def sqlite_path(url: str) -> Path:
    """`sqlite:///relative`, `sqlite:////absolute` or `sqlite:///~/home`: the file."""
    path = url.removeprefix("sqlite:///")
    if not path:
        raise StoreError(f"no file in the database url {url!r}: write sqlite:///path/to/file.db")
    return Path(path).expanduser()


async def open_database(url: str, *, command_timeout_s: float = COMMAND_TIMEOUT_S) -> Database:
    """Open the database at `url` and bring its schema up to date."""
    if url.startswith("sqlite:///"):
        from switchyard.billing.store.sqlite import SQLiteDatabase

        return await SQLiteDatabase.open(sqlite_path(url), busy_timeout_s=command_timeout_s)
    if url.startswith(("postgresql://", "postgres://")):
        from switchyard.billing.store.postgres import PostgresDatabase

        return await PostgresDatabase.open(url, command_timeout_s=command_timeout_s)
    raise StoreError(f"unknown database url {mask_password(url)!r}: use sqlite:///FILE or postgresql://…")
