"""Newest-first pages of a table with `id` and `created_at` (files, batches), as OpenAI lists them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from switchyard.billing.store import Database


async def newest_first(
    database: Database, table: str, columns: str, filters: Mapping[str, object | None], after: str | None, limit: int
) -> list[tuple[Any, ...]]:
    """Rows matching `filters` (a None value: any), newest first; `after`: those created before
    that row's (none when it is not there: an id never seen, or deleted). Table and column names
    come from the code, never from a request."""
    where: list[str] = ["1 = 1"]
    args: list[object] = []
    for column, value in filters.items():
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if after is not None:
        anchor = await database.fetch(f"SELECT created_at, id FROM {table} WHERE id = ?", after)
        if not anchor:
            return []
        where.append("(created_at, id) < (?, ?)")
        args += list(anchor[0])
    order = f"ORDER BY created_at DESC, id DESC LIMIT {int(limit)}"
    return await database.fetch(f"SELECT {columns} FROM {table} WHERE {' AND '.join(where)} {order}", *args)
