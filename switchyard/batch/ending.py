"""How a batch ends: its window runs out, it is cancelled, or every line has its result; then its
output and error files are written, once, by whichever worker holds the finalization lease."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from switchyard.batch.batches_wire import is_answer, result_line
from switchyard.batch.files import FileStore
from switchyard.batch.jobs import Batch, BatchStore

logger = logging.getLogger("switchyard.batch")

NEVER_RUN = {  # how a batch ended -> the error of each line it did not run
    "expired": ("batch_expired", "This request could not be run before the batch's window ended."),
    "cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
}
PAGE = 200  # results read (and joined on the event loop) at a time while the files are written


class Finisher:
    def __init__(self, batches: BatchStore, files: FileStore) -> None:
        self.batches = batches
        self.files = files

    async def sweep(self, batch: Batch, now: float) -> None:
        """End `batch` if its window ran out with lines not run; give the lines a cancelled or
        expired batch did not run their error; write its files if every line has a result. Lines
        running at that moment finish (and are metered), but their answers come too late for the
        files."""
        batches = self.batches
        if batch.ending is None and not batch.is_done and batch.expires_at <= now:
            if await batches.expire(batch.id, now):
                batch = await batches.get(batch.id) or batch
        if batch.ending in NEVER_RUN and not batch.is_done:
            await batches.fill_missing(batch.id, *NEVER_RUN[batch.ending])
        await self.finalize_if_done(batch.id)

    async def finalize_if_done(self, batch_id: str) -> None:
        batches = self.batches
        batch = await batches.get(batch_id)
        if batch is None or not batch.is_done:
            return
        lease = await batches.take_finalization(batch_id)
        if lease is None:
            return
        batch = await batches.get(batch_id)
        assert batch is not None
        # files of their own: a finalizer that took over from a slow one never writes into its files
        output = await self._write_file(batch, "output", answers=True)
        errors = await self._write_file(batch, "error", answers=False)
        if await batches.finish(batch, lease, output, errors):
            logger.info("batch %s is %s", batch.id, batch.ending or "completed")
            return
        for file_id in (output, errors):  # another worker took it over and finished it
            if file_id is not None:
                await self.files.delete(file_id)

    async def _write_file(self, batch: Batch, kind: str, *, answers: bool) -> str | None:
        """The output (answers) or error file, in line order; None when it would be empty."""
        files = self.files
        num_lines = 0

        async def lines() -> AsyncIterator[bytes]:
            nonlocal num_lines
            after = -1
            while page := await self.batches.results(batch.id, after, PAGE):
                chosen = [r for r in page if is_answer(r) == answers]
                num_lines += len(chosen)
                after = page[-1].line
                if chosen:
                    yield b"".join(result_line(r) for r in chosen)

        stored = await files.create(batch.team, "batch_output", f"{batch.id}_{kind}.jsonl", lines())
        if num_lines == 0:
            await files.delete(stored.id)
            return None
        return stored.id
