"""A multipart/form-data upload read as it arrives: the `file` part's bytes are handed on chunk by
chunk (to storage), never held whole; the small text fields (`purpose`) are kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from switchyard.core.errors import InvalidRequest

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELD_BYTES = 1024  # a text field (purpose); a file is not a field
MAX_PARTS = 16  # parts of one form


class Upload:
    def __init__(self, request: Request, *, file_field: str = "file", idle_timeout_s: float = 30.0) -> None:
        self.request = request
        self.file_field = file_field
        self.idle_timeout_s = idle_timeout_s
        self.fields: dict[str, str] = {}
        self.filename: str | None = None  # set once the file part began
        self._headers: dict[bytes, bytes] = {}
        self._header_field = b""
        self._header_value = b""
        self._name: str | None = None
        self._is_file = False
        self._field = bytearray()
        self._out: list[bytes] = []
        self._num_parts = 0

    def _boundary(self) -> bytes:
        content_type, params = parse_options_header(self.request.headers.get("content-type", ""))
        boundary = params.get(b"boundary")
        if content_type != b"multipart/form-data" or not boundary:
            raise InvalidRequest(
                "Upload the file as multipart/form-data, with the parts 'file' and 'purpose'.", param="file"
            )
        return boundary

    def _callbacks(self) -> MultipartCallbacks:
        def on_part_begin() -> None:
            self._num_parts += 1
            if self._num_parts > MAX_PARTS:
                raise InvalidRequest(f"The form has more than {MAX_PARTS} parts; it needs 'file' and 'purpose'.")
            self._headers, self._name, self._is_file = {}, None, False
            self._field.clear()

        def on_header_field(data: bytes, start: int, end: int) -> None:
            self._header_field += data[start:end]

        def on_header_value(data: bytes, start: int, end: int) -> None:
            self._header_value += data[start:end]

        def on_header_end() -> None:
            self._headers[self._header_field.lower()] = self._header_value
            self._header_field, self._header_value = b"", b""

        def on_headers_finished() -> None:
            _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
            self._name = options.get(b"name", b"").decode("utf-8", "replace")
            if self._name == self.file_field:
                self._is_file = True
                self.filename = options.get(b"filename", b"upload.jsonl").decode("utf-8", "replace")[:255]

        def on_part_data(data: bytes, start: int, end: int) -> None:
            if self._is_file:
                self._out.append(data[start:end])
                return
            self._field += data[start:end]
            if len(self._field) > MAX_FIELD_BYTES:
                raise InvalidRequest(f"The form field '{self._name}' is longer than {MAX_FIELD_BYTES} bytes.")

        def on_part_end() -> None:
            if not self._is_file and self._name:
                self.fields[self._name] = self._field.decode("utf-8", "replace")

        return {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        }

    async def file_chunks(self) -> AsyncIterator[bytes]:
        """The file part's bytes as they arrive; the fields are known once this is exhausted."""
        parser = MultipartParser(self._boundary(), self._callbacks())
        stream = self.request.stream()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):
                        chunk = await anext(stream, None)
                except TimeoutError:
                    raise InvalidRequest(
                        f"The upload stalled: nothing arrived for {self.idle_timeout_s:g} s (server.body_timeout_s).",
                        code="body_timeout",
                    ) from None
                if chunk is None:
                    break
                parser.write(chunk)
                if self._out:
                    yield b"".join(self._out)
                    self._out.clear()
            parser.finalize()
        except MultipartParseError as exc:
            raise InvalidRequest(f"The multipart body could not be read: {exc}.", param="file") from None
        if self._out:
            yield b"".join(self._out)
            self._out.clear()
