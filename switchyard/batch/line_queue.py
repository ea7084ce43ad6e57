"""The batch tier's work on a Valkey stream, read through one consumer group by every worker.

An entry is a batch to validate or one line to run: `{kind, batch, line, tries}`, never a line's
contents (those stay in the database). A worker reads entries with XREADGROUP; they stay pending,
its own, until it acknowledges them (XACK, then XDEL) once the result is written. While it works
on them it touches them (XCLAIM … JUSTID, which resets their idle time); an entry idle longer than
`claim_after_s` belongs to a worker that died or hung, and XAUTOCLAIM hands it to another. The
stream and its group survive every proxy's restart: they live in Valkey, with the budgets.

Every call re-raises a cancellation the client dropped (`_kept_cancelled`): a worker told to stop
must stop, not go on claiming lines.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

STREAM = "switchyard:batch:work"  # lines to run
VALIDATE_STREAM = "switchyard:batch:validate"  # batches to check: read beside the lines, never behind them
GROUP = "switchyard-batch"
BLOCK_MS = 1000
ADD_AT_ONCE = 200  # entries a pipeline adds: packing each takes the event loop, so a few at a time


@dataclass(frozen=True, slots=True)
class Work:
    entry_id: str
    kind: str  # validate | line
    batch_id: str
    line: int = -1
    tries: int = 0
    stream: str = ""  # where it was read from

    def fields(self) -> dict[str, str]:
        return {"kind": self.kind, "batch": self.batch_id, "line": str(self.line), "tries": str(self.tries)}


def _kept_cancelled() -> None:
    """redis-py sends each command under `asyncio.wait_for`, which on Python 3.11 returns the
    command's answer when the task is cancelled as the command completes, dropping the
    cancellation (13 of 100 cancels, at random moments, on a busy machine). The task still counts it
    (`cancelling()`): raise it here, or the worker's loops run on after its shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _work(stream: str, entry_id: str, fields: dict[str, str]) -> Work:
    line, tries = int(fields.get("line", -1)), int(fields.get("tries", 0))
    return Work(entry_id, fields["kind"], fields["batch"], line, tries, stream)


class LineQueue:
    def __init__(
        self,
        url: str,
        *,
        claim_after_s: float,
        stream: str = STREAM,
        validate_stream: str = VALIDATE_STREAM,
        group: str = GROUP,
    ) -> None:
        self.stream, self.validate_stream, self.group = stream, validate_stream, group
        self.streams = (validate_stream, stream)
        self.claim_after_ms = int(claim_after_s * 1000)
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        # XREADGROUP blocks up to BLOCK_MS: the socket waits longer than that
        self._client = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=BLOCK_MS / 1000 + 5, socket_connect_timeout=5
        )
        self._has_group = False
        self._claim_from = {stream: "0-0" for stream in self.streams}  # XAUTOCLAIM's cursor, per stream

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _ensure_group(self) -> None:
        if self._has_group:
            return
        for stream in self.streams:
            try:
                await self._client.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            _kept_cancelled()
        self._has_group = True

    def _stream_of(self, work: Work) -> str:
        return self.validate_stream if work.kind == "validate" else self.stream

    async def add(self, works: Sequence[Work]) -> None:
        await self._ensure_group()
        for first in range(0, len(works), ADD_AT_ONCE):
            async with self._client.pipeline(transaction=False) as pipe:
                for work in works[first : first + ADD_AT_ONCE]:
                    pipe.xadd(self._stream_of(work), work.fields())  # type: ignore[arg-type]
                await pipe.execute()
            _kept_cancelled()

    async def take(self, count: int, *, validations: bool = False, block: bool = True) -> list[Work]:
        """New lines (or batches to validate), up to `count`, waiting up to a second for one when
        `block`. Validations have a stream of their own: a new batch is checked at once, never
        after the lines queued before it."""
        await self._ensure_group()
        stream = self.validate_stream if validations else self.stream
        try:
            answer = await self._client.xreadgroup(
                self.group, self.consumer, {stream: ">"}, count=count, block=BLOCK_MS if block else None
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):  # the stream was deleted (a flushed Valkey): made again next call
                raise
            self._has_group = False
            return []
        _kept_cancelled()
        streams: list[tuple[str, list[tuple[str, dict[str, str]]]]] = answer or []  # type: ignore[assignment]
        return [_work(stream, entry_id, fields) for _, entries in streams for entry_id, fields in entries]

    async def claim_abandoned(self, count: int) -> list[Work]:
        """Entries another worker took and left untouched for `claim_after_s`: now this one's (at
        most `count`, over both streams)."""
        await self._ensure_group()
        claimed: list[Work] = []
        for stream in self.streams:
            if len(claimed) >= count:
                break
            try:
                answer = await self._client.xautoclaim(
                    stream,
                    self.group,
                    self.consumer,
                    self.claim_after_ms,
                    start_id=self._claim_from[stream],
                    count=count - len(claimed),
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._has_group = False
                return claimed
            _kept_cancelled()
            self._claim_from[stream] = answer[0] if isinstance(answer[0], str) else "0-0"  # "0-0": round again
            claimed += [_work(stream, entry_id, fields) for entry_id, fields in answer[1] if fields]
        return claimed

    async def touch(self, works: Sequence[Work]) -> None:
        """Still at work on these: their idle time starts again."""
        for stream in self.streams:
            ids: list[int | bytes | str | memoryview] = [work.entry_id for work in works if work.stream == stream]
            if ids:
                await self._client.xclaim(
                    stream, self.group, self.consumer, min_idle_time=0, message_ids=ids, justid=True
                )
                _kept_cancelled()

    async def done(self, works: Sequence[Work]) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            for work in works:
                pipe.xack(work.stream, self.group, work.entry_id)
                pipe.xdel(work.stream, work.entry_id)
            await pipe.execute()
        _kept_cancelled()
