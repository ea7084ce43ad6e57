"""Reading and validating request bodies into wire models, with OpenAI-style errors."""

from __future__ import annotations

from typing import TypeVar

import orjson
from fastapi import Request
from pydantic import ValidationError

from switchyard.core.errors import InvalidRequest, MalformedJSON, RequestTooLarge
from switchyard.core.protocol import WireRequest
from switchyard.core.settings import format_location

M = TypeVar("M", bound=WireRequest)


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLarge(f"Request body is {declared} bytes; the limit is {max_bytes}.")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > max_bytes:
            raise RequestTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
        parts.append(part)
    return b"".join(parts)


def parse_request(model: type[M], body: bytes) -> M:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedJSON(
            f"We could not parse the JSON body of your request ({exc.msg} at position {exc.pos})."
        ) from exc
    if not isinstance(payload, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return model.from_payload(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = format_location(first["loc"])
        if first["type"] == "missing":
            message = f"Missing required parameter: '{param}'."
        else:
            message = f"Invalid value for '{param}': {first['msg']}."
        code = "missing_required_parameter" if first["type"] == "missing" else "invalid_value"
        raise InvalidRequest(message, param=param, code=code) from exc


async def read_request(request: Request, model: type[M]) -> M:
    max_bytes = request.app.state.services.settings.server.max_body_bytes
    return parse_request(model, await read_body(request, max_bytes))
