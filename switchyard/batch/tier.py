"""What the batch endpoints and the workers share: the files, the batches, the queue."""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.batch.ending import Finisher
from switchyard.batch.files import FileStore
from switchyard.batch.jobs import BatchStore
from switchyard.batch.line_queue import LineQueue
from switchyard.billing.store import Database
from switchyard.core.settings import BatchSettings


@dataclass(frozen=True, slots=True)
class BatchTier:
    settings: BatchSettings
    files: FileStore
    batches: BatchStore
    queue: LineQueue
    finisher: Finisher

    @classmethod
    def open(cls, settings: BatchSettings, database: Database, redis_url: str) -> BatchTier:
        files = FileStore(database, settings.files_dir)
        batches = BatchStore(database)
        queue = LineQueue(redis_url, claim_after_s=settings.claim_after_s)
        return cls(settings, files, batches, queue, Finisher(batches, files))

    async def aclose(self) -> None:
        await self.queue.aclose()
