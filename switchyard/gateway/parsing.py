"""Validating request bodies into wire models, with OpenAI-style errors.

A body is parsed, held to the limits beyond bytes (`switchyard.core.body_limits`) and validated.
A large body is parsed and validated in a worker thread: validating 100,000 tiny messages held the
event loop for 0.35 s. A small one stays on the loop, where the work costs less than the hop to a
thread.

The parser itself holds the GIL, thread or not, so the loop waits for it. What made it slow on a
hostile body (a million empty arrays: 0.7 s) was the cyclic garbage collector, run again and
again over the containers being built; it is paused while a large body is parsed (0.1 s).
"""

from __future__ import annotations

import asyncio
import gc
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, Self, TypeVar

import orjson
from pydantic import ValidationError

from switchyard.core.body_limits import BodyLimits, check_body_limits, too_deep_error
from switchyard.core.errors import InvalidRequest, InvalidType, MalformedJSON, SwitchyardError


class FromPayload(Protocol):
    """A body model: built from the JSON object it was validated from (`WireRequest`, the admin API's bodies)."""

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self: ...


M = TypeVar("M", bound=FromPayload)

OFF_LOOP_BYTES = 64 * 1024  # bodies this large or larger are parsed in a worker thread

_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}
# How pydantic names the members of a union in an error's location (`stop.str`, `prompt.list[int]`):
# not part of the client's JSON, so left out of `param`.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|list\[.*\]|dict\[.*\])$")


class _CollectorPause:
    """Pauses the cyclic garbage collector while any large body is being parsed. Parsing creates
    no cycles, so nothing is left for the collector that it cannot take afterwards."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_parsing = 0
        self._was_enabled = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._num_parsing == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._num_parsing += 1
        try:
            yield
        finally:
            with self._lock:
                self._num_parsing -= 1
                if self._num_parsing == 0 and self._was_enabled:
                    gc.enable()


_COLLECTOR = _CollectorPause()


def parse_request(model: type[M], body: bytes, limits: BodyLimits) -> M:
    """The body as a `model`; a refusal after the JSON parsed carries the `model` it named
    (`SwitchyardError.requested_model`: the request count labels it)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in exc.msg:  # orjson refuses more than 1024 levels
            raise too_deep_error(limits.max_json_depth) from exc
        raise MalformedJSON(
            f"We could not parse the JSON body of your request ({exc.msg} at position {exc.pos})."
        ) from exc
    if not isinstance(payload, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        check_body_limits(payload, limits)
        try:
            return model.from_payload(payload)
        except ValidationError as exc:
            raise invalid_request(exc) from exc
    except SwitchyardError as exc:
        name = payload.get("model")
        exc.requested_model = name if isinstance(name, str) else None
        raise


async def parse_body(model: type[M], body: bytes, limits: BodyLimits) -> M:
    """`parse_request`, on a worker thread for a large body."""
    if len(body) < OFF_LOOP_BYTES:
        return parse_request(model, body, limits)
    return await asyncio.to_thread(_parse_large, model, body, limits)


def _parse_large(model: type[M], body: bytes, limits: BodyLimits) -> M:
    with _COLLECTOR.paused():
        return parse_request(model, body, limits)


def invalid_request(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    param = _param(first["loc"])
    if first["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if first["type"] in _EXPECTED:
        return InvalidType(
            f"Invalid type for '{param}': expected {_EXPECTED[first['type']]}, "
            f"but got {_describe(first['input'])} instead.",
            param=param,
        )
    return InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value")


def _param(loc: tuple[int | str, ...]) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'"""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_MEMBER.match(part):
            out += f".{part}" if out else part
    return out


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
