"""The usage ledger's writer: records queue in memory and a background task writes them in batches.

`LedgerWriter.record()` is an append (it never blocks a request, never raises). The writer task
never dies: a write that fails (the database down, locked or slow) is logged loudly, its batch is
appended to the spill file (JSON lines, flushed), and the task backs off and keeps going. Once a
write succeeds again the spill file is renamed aside and replayed; inserts are idempotent on
(request_id, attempt), so a replay after a crash half-way through counts nothing twice. At close,
what is pending is written, or spilled if the database does not answer in time; a spill file left
by an earlier run is replayed in the background after the next `start()`. A record the database
refuses outright (a NaN cost, say) is set apart in `<spill file>.rejected`, logged, and does not
hold the others back.

Several worker processes (`switchyard serve --workers N`) each append to their own spill file
(`worker_spill_path`); before any of them starts, `adopt_spill_files` hands every file a previous
run left (any worker's, or the single process's) to the one writer that starts first, so nothing
spilled is forgotten whatever the number of workers next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from switchyard.billing.records import UsageRecord
from switchyard.billing.store import Database, StoreError, StoreUnavailable

__all__ = ["Ledger", "LedgerStatus", "LedgerWriter", "adopt_spill_files", "worker_spill_path"]

logger = logging.getLogger("switchyard.ledger")
_FIELDS = frozenset(f.name for f in dataclasses.fields(UsageRecord))


def worker_spill_path(spill_path: Path, index: int) -> Path:
    """Worker `index`'s own spill file beside `spill_path`: ledger-spill.jsonl -> ledger-spill.worker-1.jsonl."""
    return spill_path.with_name(f"{spill_path.stem}.worker-{index}{spill_path.suffix}")


def adopt_spill_files(spill_path: Path, into: Path) -> int:
    """Rename every spill file of the `spill_path` family (the single process's, each worker's, and
    the ones set aside for a replay) that is not `into`'s own to `into`'s replay files, which the
    writer using `into` replays after its start. Call it while no writer runs. Returns how many."""
    spill_path, into = spill_path.expanduser(), into.expanduser()
    stem, suffix = re.escape(spill_path.stem), re.escape(spill_path.suffix)
    family = re.compile(rf"{stem}(\.worker-\d+)?{suffix}(\.replay-[0-9a-f]+)?")
    own = re.compile(rf"{re.escape(into.name)}(\.replay-[0-9a-f]+)?")
    if not spill_path.parent.is_dir():
        return 0
    num_adopted = 0
    for path in sorted(spill_path.parent.iterdir()):
        if family.fullmatch(path.name) and not own.fullmatch(path.name) and path.is_file():
            path.rename(into.with_name(f"{into.name}.replay-{uuid.uuid4().hex[:8]}"))
            num_adopted += 1
    if num_adopted:
        logger.info("ledger: %d spill file(s) of an earlier run will be replayed by %s", num_adopted, into)
    return num_adopted


class Ledger(Protocol):
    def record(self, record: UsageRecord) -> None: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LedgerStatus:
    pending: int  # records in memory, not written yet
    spilled: int  # records in the spill file(s), waiting for the database
    is_behind: bool  # writes are failing, or records wait in the spill file
    last_error: str | None  # the reason of the last failed write (None once one succeeds)
    last_written_at: float | None  # unix seconds of the last successful write


class LedgerWriter:
    remind_every_s = 30.0  # while writes keep failing, one reminder this often

    def __init__(
        self,
        database: Database,
        spill_path: str | Path,
        *,
        flush_interval_s: float = 0.2,
        max_backoff_s: float = 5.0,
        batch_size: int = 500,
        close_timeout_s: float = 2.0,
    ) -> None:
        self.database = database
        self.spill_path = Path(spill_path).expanduser()
        self.flush_interval_s = flush_interval_s
        self.max_backoff_s = max_backoff_s
        self.batch_size = batch_size
        self.close_timeout_s = close_timeout_s
        self._pending: list[UsageRecord] = []
        self._num_spilled = 0
        self._lock = asyncio.Lock()  # one writer at a time: the task, flush() and aclose()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._is_closing = False
        self._is_closed = False
        self._backoff_s = 0.0
        self._last_error: str | None = None
        self._failing_since: float | None = None
        self._reminded_at = 0.0
        self._last_written_at: float | None = None

    def record(self, record: UsageRecord) -> None:
        if self._is_closed:  # metered after close (a request that outlived the drain): kept for the next start
            with contextlib.suppress(OSError):
                self._spill([record])
            logger.warning(
                "ledger record %s/%s after close: spilled to %s", record.request_id, record.attempt, self.spill_path
            )
            return
        self._pending.append(record)

    async def start(self) -> None:
        """Start the writer task; a spill file an earlier run left is replayed by it, in the background."""
        self._num_spilled = await asyncio.to_thread(self._count_spilled)
        self._task = asyncio.create_task(self._write_forever(), name="ledger-writer")

    def status(self) -> LedgerStatus:
        return LedgerStatus(
            pending=len(self._pending),
            spilled=self._num_spilled,
            is_behind=self._failing_since is not None or self._num_spilled > 0,
            last_error=self._last_error,
            last_written_at=self._last_written_at,
        )

    async def flush(self) -> None:
        """Write what is pending now (spilling it if the database fails); never raises."""
        async with self._lock:
            await self._write_pending()

    async def read(self, *, request_id: str | None = None, client_request_id: str | None = None) -> list[UsageRecord]:
        return await self.database.read_usage(request_id=request_id, client_request_id=client_request_id)

    async def aclose(self) -> None:
        """Write everything pending; spill it if the database does not answer within `close_timeout_s`."""
        self._is_closing = True
        self._wake.set()
        if self._task is not None:
            # a write stuck on a hung database is cut short: its batch is spilled (see _write_pending)
            await asyncio.wait({self._task}, timeout=self.close_timeout_s)
            if not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task})
            self._task = None
        async with self._lock:
            batch, self._pending = self._pending, []
            if batch:
                try:
                    await asyncio.wait_for(self._insert(batch), self.close_timeout_s)
                except Exception as exc:  # whatever failed, the records go to the spill file
                    self._spill_logged(batch, exc)
            self._is_closed = True

    async def _write_forever(self) -> None:
        while not self._is_closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._backoff_s or self.flush_interval_s)
            self._wake.clear()
            if self._is_closing:
                return
            try:
                async with self._lock:
                    if await self._write_pending() and self._num_spilled:
                        await self._replay()
            except Exception:  # the loop must survive anything, a bug in this module included
                logger.exception("ledger writer: unexpected error; going on")

    async def _write_pending(self) -> bool:
        """True when everything pending was written (or nothing was)."""
        while self._pending:
            batch = self._pending[: self.batch_size]
            del self._pending[: len(batch)]
            try:
                await self._insert(batch)
            except asyncio.CancelledError:  # aclose() gave up on a hung write (perhaps done: a replay skips it)
                self._spill_logged(batch, TimeoutError("no answer before the ledger closed"))
                raise
            except Exception as exc:  # whatever failed, what waits goes to the spill file, not to memory
                batch += self._pending
                self._pending = []
                self._spill_logged(batch, exc)
                return False
        return True

    async def _insert(self, batch: Sequence[UsageRecord]) -> None:
        try:
            await self.database.insert_usage(batch)
        except StoreUnavailable:
            raise
        except StoreError as exc:  # the database refused the data: no retry would help
            if len(batch) > 1:
                for record in batch:  # write the others; set the offending record(s) apart
                    await self._insert([record])
                return
            self._reject(batch[0], exc)
        self._succeeded()

    def _reject(self, record: UsageRecord, exc: StoreError) -> None:
        """Keep a record the database refuses (a NaN cost, say) beside the spill file, and say so."""
        rejected = self.spill_path.with_name(self.spill_path.name + ".rejected")
        logger.error(
            "ledger: the database refused %s/%s (%s); kept in %s", record.request_id, record.attempt, exc, rejected
        )
        try:
            rejected.parent.mkdir(parents=True, exist_ok=True)
            with rejected.open("a", encoding="utf-8") as file:
                file.write(json.dumps(dataclasses.asdict(record)) + "\n")
        except OSError as write_exc:
            logger.error("ledger: record %s/%s lost: %s", record.request_id, record.attempt, write_exc)

    async def _replay(self) -> None:
        """Rename the spill file aside (new spills go to a fresh one), insert its records, delete it."""
        for aside in await asyncio.to_thread(self._set_spills_aside):
            num_replayed = 0
            with aside.open(encoding="utf-8") as file:
                batches = _read_spill(file, aside, self.batch_size)  # a batch at a time: it may be large
                batch: list[UsageRecord]
                try:
                    while batch := await asyncio.to_thread(next, batches, []):
                        await self._insert(batch)
                        num_replayed += len(batch)
                except Exception as exc:  # kept aside; replayed again on the next success
                    self._failed(exc)
                    return
            aside.unlink()
            self._num_spilled = max(0, self._num_spilled - num_replayed)
            logger.info("ledger: replayed %d spilled records from %s", num_replayed, aside)

    def _set_spills_aside(self) -> list[Path]:
        if self.spill_path.exists():
            self.spill_path.rename(self.spill_path.with_name(f"{self.spill_path.name}.replay-{uuid.uuid4().hex[:8]}"))
        return sorted(self.spill_path.parent.glob(f"{self.spill_path.name}.replay-*"))

    def _count_spilled(self) -> int:
        paths = [self.spill_path, *self.spill_path.parent.glob(f"{self.spill_path.name}.replay-*")]
        num_spilled = 0
        for path in paths:
            if path.exists():
                with path.open(encoding="utf-8") as file:
                    num_spilled += sum(len(batch) for batch in _read_spill(file, path, self.batch_size))
        return num_spilled

    def _spill_logged(self, batch: list[UsageRecord], exc: Exception) -> None:
        self._failed(exc)
        try:
            self._spill(batch)
        except OSError as spill_exc:  # nowhere left to keep them: say so, loudly
            logger.error(
                "ledger: %d records lost: cannot write the spill file %s: %s", len(batch), self.spill_path, spill_exc
            )

    def _spill(self, batch: Sequence[UsageRecord]) -> None:
        self.spill_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spill_path.open("a", encoding="utf-8") as file:
            file.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in batch)
            file.flush()
        self._num_spilled += len(batch)

    def _failed(self, exc: BaseException) -> None:
        now = time.time()
        self._last_error = f"{type(exc).__name__}: {exc}"
        self._backoff_s = min(self.max_backoff_s, max(self.flush_interval_s, self._backoff_s * 2 or 0.1))
        if self._failing_since is None:
            self._failing_since = self._reminded_at = now
            logger.error(
                "ledger: writing to %s failed (%s); records go to %s until it works again",
                self.database.display_url,
                self._last_error,
                self.spill_path,
            )
        elif now - self._reminded_at >= self.remind_every_s:
            self._reminded_at = now
            logger.error(
                "ledger: %s still failing for %.0f s (%s); %d records spilled",
                self.database.display_url,
                now - self._failing_since,
                self._last_error,
                self._num_spilled,
            )

    def _succeeded(self) -> None:
        self._last_written_at = time.time()
        self._backoff_s = 0.0
        if self._failing_since is not None:
            logger.info(
                "ledger: writing to %s again after %.0f s", self.database.display_url, time.time() - self._failing_since
            )
            self._failing_since = None
            self._last_error = None


def _read_spill(file: TextIO, path: Path, batch_size: int) -> Iterator[list[UsageRecord]]:
    batch: list[UsageRecord] = []
    for number, line in enumerate(file, start=1):
        try:
            values = json.loads(line)
            batch.append(UsageRecord(**{k: v for k, v in values.items() if k in _FIELDS}))
        except (ValueError, TypeError, AttributeError) as exc:  # a line cut short by a crash
            logger.warning("ledger: skipping line %d of %s: %s", number, path, exc)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
