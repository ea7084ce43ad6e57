"""Batches, their lines and results, in the ledger's database.

The status sequence is OpenAI's: validating → in_progress → finalizing → completed; validating →
failed; in_progress → expired (the window ran out: the lines not run are `batch_expired` entries of
the error file); validating or in_progress → cancelling → cancelled (the lines not run are
`batch_cancelled` entries). Every move is one conditional UPDATE, so two workers racing for it
cannot both make it. A line's result is written once (its key is the batch and the line); a
trigger counts it into the batch's `completed` or `failed` in the same statement. The output and
error files are written once every line has a result, by whichever worker takes the finalization
lease (taken again if that worker dies before it is done).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from switchyard.batch.lines import Line, LineError
from switchyard.batch.pages import newest_first
from switchyard.billing.records import UsageRecord
from switchyard.billing.store import Database

BATCH_FIELDS = (
    "id",
    "team",
    "key_id",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "metadata",
    "errors",
    "output_file_id",
    "error_file_id",
    "created_at",
    "expires_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "ending",
    "finalize_lease",
    "total",
    "completed",
    "failed",
)
_COLUMNS = ", ".join(BATCH_FIELDS)
OPEN_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
FINALIZE_LEASE_S = 120.0  # a finalization not done in this long is taken over


@dataclass(frozen=True, slots=True)
class Batch:
    id: str
    team: str
    key_id: str | None
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    metadata: dict[str, Any] | None
    errors: list[dict[str, Any]] | None
    output_file_id: str | None
    error_file_id: str | None
    created_at: float
    expires_at: float
    in_progress_at: float | None
    finalizing_at: float | None
    completed_at: float | None
    failed_at: float | None
    expired_at: float | None
    cancelling_at: float | None
    cancelled_at: float | None
    ending: str | None  # what it ends as once every line has a result: cancelled, expired (else completed)
    finalize_lease: float | None
    total: int
    completed: int
    failed: int

    @property
    def is_done(self) -> bool:
        """Every line has its result (a batch still validating has none to wait for once it ended)."""
        return (self.status != "validating" or self.ending is not None) and self.completed + self.failed >= self.total


@dataclass(frozen=True, slots=True)
class Result:
    line: int
    custom_id: str
    request_id: str
    status_code: int | None  # None: the line never ran (expired, cancelled)
    body: str | None  # the answer or the refusal, JSON
    error_code: str | None = None
    error_message: str | None = None


def _batch(row: Sequence[Any]) -> Batch:
    values = dict(zip(BATCH_FIELDS, row, strict=True))
    for name in ("metadata", "errors"):
        values[name] = orjson.loads(values[name]) if values[name] is not None else None
    for name in ("total", "completed", "failed"):
        values[name] = int(values[name])
    return Batch(**values)


_INSERT_RESULT = (
    "INSERT INTO batch_results (batch_id, line, custom_id, request_id, status_code, body, error_code, "
    "error_message, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (batch_id, line) DO NOTHING"
)


def _result_args(batch_id: str, result: Result) -> tuple[Any, ...]:
    return (
        batch_id,
        result.line,
        result.custom_id,
        result.request_id,
        result.status_code,
        result.body,
        result.error_code,
        result.error_message,
        time.time(),
    )


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def line_request_id(batch_id: str, line: int) -> str:
    """A line's request id, the same in every run of it: `batch_req_<batch>_<line>`."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


class BatchStore:
    def __init__(self, database: Database) -> None:
        self.database = database

    async def create(
        self,
        *,
        team: str,
        key_id: str | None,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        window_s: float,
        metadata: dict[str, str] | None,
    ) -> Batch:
        now = time.time()
        batch_id = new_batch_id()
        await self.database.execute(
            "INSERT INTO batches (id, team, key_id, endpoint, input_file_id, completion_window, status, metadata, "
            "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, 'validating', ?, ?, ?)",
            batch_id,
            team,
            key_id,
            endpoint,
            input_file_id,
            completion_window,
            orjson.dumps(metadata).decode() if metadata is not None else None,
            now,
            now + window_s,
        )
        batch = await self.get(batch_id)
        assert batch is not None
        return batch

    async def get(self, batch_id: str) -> Batch | None:
        rows = await self.database.fetch(f"SELECT {_COLUMNS} FROM batches WHERE id = ?", batch_id)
        return _batch(rows[0]) if rows else None

    async def page(self, team: str | None, *, after: str | None = None, limit: int = 20) -> list[Batch]:
        """Newest first; `after`: the batches created before that one."""
        rows = await newest_first(self.database, "batches", _COLUMNS, {"team": team}, after, limit)
        return [_batch(row) for row in rows]

    async def open_batches(self) -> list[Batch]:
        marks = ", ".join("?" for _ in OPEN_STATUSES)
        rows = await self.database.fetch(f"SELECT {_COLUMNS} FROM batches WHERE status IN ({marks})", *OPEN_STATUSES)
        return [_batch(row) for row in rows]

    # validating

    async def set_lines(self, batch_id: str, lines: Sequence[Line]) -> None:
        """Where each line is in the input file (again after a crash: the same rows)."""
        rows = [(batch_id, line.index, line.custom_id, line.start, line.length) for line in lines]
        for first in range(0, len(rows), 5000):
            await self.database.execute_many(
                "INSERT INTO batch_lines (batch_id, line, custom_id, start, length) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (batch_id, line) DO NOTHING",
                rows[first : first + 5000],
            )
        await self.database.execute(
            "UPDATE batches SET total = ? WHERE id = ? AND status = 'validating'", len(rows), batch_id
        )

    async def start(self, batch_id: str) -> bool:
        """validating → in_progress (False: it was cancelled, or has moved on already)."""
        changed = await self.database.execute(
            "UPDATE batches SET status = 'in_progress', in_progress_at = ? WHERE id = ? AND status = 'validating'",
            time.time(),
            batch_id,
        )
        return changed > 0

    async def fail(self, batch_id: str, errors: Sequence[LineError], num_errors: int) -> bool:
        """validating → failed, with `errors` (OpenAI's list object)."""
        data = [error.as_dict() for error in errors]
        if num_errors > len(data):
            data.append(
                {"code": "more_errors", "message": f"{num_errors - len(data)} more lines have errors.", "param": None}
            )
        changed = await self.database.execute(
            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ? WHERE id = ? AND status = 'validating'",
            time.time(),
            orjson.dumps({"object": "list", "data": data}).decode(),
            batch_id,
        )
        return changed > 0

    # running

    async def line(self, batch_id: str, index: int) -> tuple[Line, bool] | None:
        """The line, and whether it has its result: one query."""
        rows = await self.database.fetch(
            "SELECT l.custom_id, l.start, l.length, "
            "(SELECT COUNT(*) FROM batch_results r WHERE r.batch_id = l.batch_id AND r.line = l.line) "
            "FROM batch_lines l WHERE l.batch_id = ? AND l.line = ?",
            batch_id,
            index,
        )
        if not rows:
            return None
        custom_id, start, length, num_results = rows[0]
        return Line(index, str(custom_id), int(start), int(length)), int(num_results) > 0

    async def write_result(
        self, batch_id: str, result: Result | None, usage: Sequence[UsageRecord]
    ) -> tuple[bool, bool]:
        """The line's usage and its result (unless it has one; None: only the usage), in one
        transaction: a line whose result is written has its usage in the ledger, and one that has
        neither runs again. The usage's attempts are numbered after those earlier runs of the line
        left, so a line run twice is one request with every attempt's cost. Returns (this result
        was written, every line of the batch has one)."""
        statements: list[tuple[str, Sequence[Any]]] = []
        if result is not None:
            statements.append((_INSERT_RESULT + " RETURNING line", _result_args(batch_id, result)))
        statements.append(("SELECT total, completed, failed, status FROM batches WHERE id = ?", (batch_id,)))
        *inserted, counts = await self.database.insert_usage_with(usage, statements)
        written = bool(inserted and inserted[0])
        is_done = bool(counts) and counts[0][3] != "validating" and counts[0][1] + counts[0][2] >= counts[0][0]
        return written, is_done

    async def fill_missing(self, batch_id: str, code: str, message: str) -> int:
        """Every line without a result gets one that says why it never ran (expired, cancelled)."""
        prefix = line_request_id(batch_id, 0)[:-1]
        return await self.database.execute(
            "INSERT INTO batch_results (batch_id, line, custom_id, request_id, status_code, body, error_code, "
            "error_message, finished_at) "
            "SELECT l.batch_id, l.line, l.custom_id, ? || CAST(l.line AS TEXT), NULL, NULL, ?, ?, ? "
            "FROM batch_lines l WHERE l.batch_id = ? AND NOT EXISTS "
            "(SELECT 1 FROM batch_results r WHERE r.batch_id = l.batch_id AND r.line = l.line) "
            "ON CONFLICT (batch_id, line) DO NOTHING",
            prefix,
            code,
            message,
            time.time(),
            batch_id,
        )

    async def results(self, batch_id: str, after: int, limit: int) -> list[Result]:
        rows = await self.database.fetch(
            "SELECT line, custom_id, request_id, status_code, body, error_code, error_message FROM batch_results "
            f"WHERE batch_id = ? AND line > ? ORDER BY line LIMIT {int(limit)}",
            batch_id,
            after,
        )
        return [Result(int(r[0]), r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]

    # ending

    async def cancel(self, batch_id: str) -> bool:
        """validating or in_progress → cancelling (False: it was past those)."""
        changed = await self.database.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ?, ending = 'cancelled' "
            "WHERE id = ? AND status IN ('validating', 'in_progress') AND ending IS NULL",
            time.time(),
            batch_id,
        )
        return changed > 0

    async def expire(self, batch_id: str, now: float) -> bool:
        """Its window ran out with lines not run: it ends as expired."""
        changed = await self.database.execute(
            "UPDATE batches SET ending = 'expired' "
            "WHERE id = ? AND status IN ('validating', 'in_progress') AND ending IS NULL AND expires_at <= ?",
            batch_id,
            now,
        )
        return changed > 0

    async def take_finalization(self, batch_id: str) -> float | None:
        """Every line has a result: the lease to write the output files (its token, None: another
        worker holds it, or the batch is not done). A batch that will complete shows `finalizing`
        from here."""
        now = time.time()
        lease = now + FINALIZE_LEASE_S
        changed = await self.database.execute(
            "UPDATE batches SET finalize_lease = ?, "
            "finalizing_at = CASE WHEN ending IS NULL THEN COALESCE(finalizing_at, ?) ELSE finalizing_at END, "
            "status = CASE WHEN ending IS NULL THEN 'finalizing' ELSE status END "
            "WHERE id = ? AND status IN ('validating', 'in_progress', 'finalizing', 'cancelling') "
            "AND (status != 'validating' OR ending IS NOT NULL) "
            "AND completed + failed >= total AND (finalize_lease IS NULL OR finalize_lease < ?)",
            lease,
            now,
            batch_id,
            now,
        )
        return lease if changed > 0 else None

    async def finish(self, batch: Batch, lease: float, output_file_id: str | None, error_file_id: str | None) -> bool:
        """The files are written: completed, cancelled or expired, with its timestamp, if this
        worker's lease still holds (False: another took the finalization over; its files win)."""
        status = batch.ending or "completed"
        changed = await self.database.execute(
            f"UPDATE batches SET status = ?, {status}_at = ?, output_file_id = ?, error_file_id = ?, "
            "finalize_lease = NULL WHERE id = ? AND finalize_lease = ?",
            status,
            time.time(),
            output_file_id,
            error_file_id,
            batch.id,
            lease,
        )
        return changed > 0
