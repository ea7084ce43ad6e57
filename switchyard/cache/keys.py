"""A chat request's cache keys: the exact key of the whole normalised request, and the semantic
context key of everything but the last user turn's text.

Both hash the request as it goes upstream (the client's fields, unknown ones included) with the
route that resolved it; what changes how an answer is delivered but not the answer (`stream`,
`stream_options`, `user`, `metadata`) is left out, and `model` is replaced by the route.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from switchyard.core.chat_wire import ChatCompletionRequest, message_text

NOT_IN_KEY = frozenset(("model", "stream", "stream_options", "user", "metadata"))
_ASKED_TURN = "\x00asked"  # stands for the last user turn's text in the context key


@dataclass(frozen=True, slots=True)
class RequestKeys:
    exact: str
    context: str | None  # None: no user turn to search by
    asked: str  # the last user turn's text ("" when there is none)


def last_user_turn(request: ChatCompletionRequest) -> int | None:
    """The index of the request's last user message (None: there is none)."""
    for i in range(len(request.messages) - 1, -1, -1):
        if request.messages[i].role == "user":
            return i
    return None


def _digest(route: tuple[str, str], body: dict[str, Any]) -> str:
    data = orjson.dumps([route, body], option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def request_keys(request: ChatCompletionRequest, route: str, model: str) -> RequestKeys:
    """The keys of `request` as `route` (what the client asked for: a model, auto or cascade)
    resolved it to `model`."""
    body = {k: v for k, v in request.wire_payload().items() if k not in NOT_IN_KEY}
    routed = (route, model)
    exact = _digest(routed, body)
    turn = last_user_turn(request)
    if turn is None or not _is_text(request.messages[turn].content):
        return RequestKeys(exact, None, "")
    messages = list(body["messages"])
    messages[turn] = {**messages[turn], "content": _ASKED_TURN}
    context = _digest(routed, {**body, "messages": messages})
    return RequestKeys(exact, context, message_text(request.messages[turn].content))


def _is_text(content: str | list[dict[str, Any]] | None) -> bool:
    """Text alone (an image or audio part is not searched by its words)."""
    if isinstance(content, str):
        return bool(content)
    return bool(content) and all(isinstance(p, dict) and p.get("type") == "text" for p in content or ())
