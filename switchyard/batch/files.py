"""Files: what `POST /v1/files` uploads and what a batch writes (its output and error files).

The metadata lives in the ledger's database (`batch_files`); the contents in the same database, in
parts of PART_BYTES (`batch_file_parts`), or in a directory (`batch.files_dir`, which every proxy
must share). A file is written part by part as its bytes arrive and read back the same way.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from switchyard.batch.pages import newest_first
from switchyard.billing.store import Database

PART_BYTES = 1024 * 1024
FILE_COLUMNS = "id, team, purpose, filename, bytes, created_at, status"


class FileTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class StoredFile:
    id: str
    team: str  # "" when no teams are configured
    purpose: str  # batch | batch_output
    filename: str
    bytes: int
    created_at: float
    status: str  # processed


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def _file(row: tuple[object, ...]) -> StoredFile:
    id_, team, purpose, filename, size, created_at, status = row
    return StoredFile(str(id_), str(team), str(purpose), str(filename), int(size), float(created_at), str(status))  # type: ignore[call-overload,arg-type]


class FileStore:
    def __init__(self, database: Database, directory: Path | None = None) -> None:
        self.database = database
        self.directory = directory.expanduser() if directory is not None else None

    async def create(
        self,
        team: str,
        purpose: str,
        filename: str,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int | None = None,
        file_id: str | None = None,
    ) -> StoredFile:
        """Write `chunks` as a new file (FileTooLarge past `max_bytes`: nothing is kept)."""
        file_id = file_id or new_file_id()
        try:
            size = await self._write(file_id, chunks, max_bytes)
        except BaseException:
            await self._drop_contents(file_id)
            raise
        stored = StoredFile(file_id, team, purpose, filename, size, time.time(), "processed")
        await self.database.execute(
            f"INSERT INTO batch_files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            stored.id,
            stored.team,
            stored.purpose,
            stored.filename,
            stored.bytes,
            stored.created_at,
            stored.status,
        )
        return stored

    async def _write(self, file_id: str, chunks: AsyncIterable[bytes], max_bytes: int | None) -> int:
        size, seq, part = 0, 0, bytearray()
        handle = None
        if self.directory is not None:
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
            handle = await asyncio.to_thread(open, self.directory / file_id, "wb")
        try:
            async for chunk in chunks:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise FileTooLarge(max_bytes)
                part += chunk
                while len(part) >= PART_BYTES:
                    await self._put(handle, file_id, seq, bytes(part[:PART_BYTES]))
                    del part[:PART_BYTES]
                    seq += 1
            if part or seq == 0:
                await self._put(handle, file_id, seq, bytes(part))
            if handle is not None:
                await asyncio.to_thread(_sync_close, handle)
                handle = None
        finally:
            if handle is not None:
                handle.close()
        return size

    async def _put(self, handle: object, file_id: str, seq: int, data: bytes) -> None:
        if handle is not None:
            await asyncio.to_thread(handle.write, data)  # type: ignore[attr-defined]
            return
        await self.database.execute(
            "INSERT INTO batch_file_parts (file_id, seq, data) VALUES (?, ?, ?)", file_id, seq, data
        )

    async def get(self, file_id: str) -> StoredFile | None:
        rows = await self.database.fetch(f"SELECT {FILE_COLUMNS} FROM batch_files WHERE id = ?", file_id)
        return _file(rows[0]) if rows else None

    async def page(
        self, team: str | None, *, purpose: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[StoredFile]:
        """Newest first; `after`: the files created before that one (pagination)."""
        filters = {"team": team, "purpose": purpose}
        rows = await newest_first(self.database, "batch_files", FILE_COLUMNS, filters, after, limit)
        return [_file(row) for row in rows]

    async def rename(self, file_id: str, filename: str) -> None:
        await self.database.execute("UPDATE batch_files SET filename = ? WHERE id = ?", filename, file_id)

    async def delete(self, file_id: str) -> bool:
        deleted = await self.database.execute("DELETE FROM batch_files WHERE id = ?", file_id)
        await self._drop_contents(file_id)
        return deleted > 0

    async def _drop_contents(self, file_id: str) -> None:
        if self.directory is not None:
            path = self.directory / file_id
            await asyncio.to_thread(lambda: path.unlink(missing_ok=True))
        else:
            await self.database.execute("DELETE FROM batch_file_parts WHERE file_id = ?", file_id)

    async def read(self, file_id: str) -> AsyncIterator[bytes]:
        """The contents, a part at a time."""
        if self.directory is not None:
            try:
                handle = await asyncio.to_thread(open, self.directory / file_id, "rb")
            except FileNotFoundError:
                return
            try:
                while chunk := await asyncio.to_thread(handle.read, PART_BYTES):
                    yield chunk
            finally:
                handle.close()
            return
        seq = 0
        while True:
            rows = await self.database.fetch(
                "SELECT data FROM batch_file_parts WHERE file_id = ? AND seq = ?", file_id, seq
            )
            if not rows:
                return
            if rows[0][0]:
                yield bytes(rows[0][0])
            seq += 1

    async def read_range(self, file_id: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (a line of an input file)."""
        if self.directory is not None:
            return await asyncio.to_thread(_read_range, self.directory / file_id, start, length)
        first, last = start // PART_BYTES, (start + length - 1) // PART_BYTES
        offset = start - first * PART_BYTES
        if first == last:  # the usual line: only its bytes leave the database, not the whole part
            rows = await self.database.fetch(
                "SELECT substr(data, ?, ?) FROM batch_file_parts WHERE file_id = ? AND seq = ?",
                offset + 1,
                length,
                file_id,
                first,
            )
            return bytes(rows[0][0]) if rows else b""
        rows = await self.database.fetch(
            "SELECT data FROM batch_file_parts WHERE file_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
            file_id,
            first,
            last,
        )
        joined = b"".join(bytes(row[0]) for row in rows)
        return joined[offset : offset + length]


def _sync_close(handle: object) -> None:
    handle.flush()  # type: ignore[attr-defined]
    os.fsync(handle.fileno())  # type: ignore[attr-defined]
    handle.close()  # type: ignore[attr-defined]


def _read_range(path: Path, start: int, length: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            return handle.read(length)
    except FileNotFoundError:  # deleted: nothing to read, as from the database
        return b""
