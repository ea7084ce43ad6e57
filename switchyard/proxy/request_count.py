"""Every request for a model counted once in `switchyard_requests_total`, whatever ends it.

The relay counts the requests it takes, when they end (`RequestDone` in switchyard.proxy.relay,
which marks the request with `note_counted`). A request that ends before it — no key or a bad one
(401), a body too large (413), malformed or invalid (400), a priority tier's cap (400, 429), a
method not allowed (405), a client gone while its body was arriving (499) — is counted here once
its response is over, with the labels the relay gives its own refusals: the model the body named
if it is configured (or `auto`, `cascade`), else "" (never a client's free text); no backend; that
model's tier; the route from the name; the status sent.
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchyard.core.metrics import route_of
from switchyard.proxy.request_log import CLIENT_CLOSED_REQUEST

MODEL_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses"))
AUTO_NAMES = ("auto", "cascade")
_REQUESTED = "requested_model"
_COUNTED = "counted_by_relay"


def note_requested_model(scope: Scope, name: object) -> None:
    """The `model` the body named, as soon as it is parsed (before it is validated)."""
    if isinstance(name, str):
        scope.setdefault("state", {})[_REQUESTED] = name


def note_counted(scope: Scope) -> None:
    """The relay has the request: it counts it when it ends."""
    scope.setdefault("state", {})[_COUNTED] = True


class RequestCountMiddleware:
    """Counts the model requests (`MODEL_PATHS`) that never reached the relay."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") not in MODEL_PATHS:
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except (asyncio.CancelledError, ClientDisconnect):
            status = status or CLIENT_CLOSED_REQUEST
            raise
        except Exception:
            status = status or 500  # RequestIdMiddleware answers it
            raise
        finally:
            if not scope.get("state", {}).get(_COUNTED):
                _count_refusal(scope, status or CLIENT_CLOSED_REQUEST)


def model_label(registry, requested: str) -> str:
    """The `model` label for a request that named `requested` and was refused before a model was
    picked: that name if it is configured (or auto, cascade), else "" (never a client's free text)."""
    return requested if requested in AUTO_NAMES or registry.find(requested) is not None else ""


def _count_refusal(scope: Scope, status: int) -> None:
    services = getattr(scope["app"].state, "services", None)
    if services is None:  # the app has not started
        return
    requested = scope.get("state", {}).get(_REQUESTED, "")
    entry = services.registry.find(requested)
    services.metrics.request_refused(
        model=model_label(services.registry, requested),
        tier=(entry.tier or "") if entry is not None else "",
        route=route_of(requested),
        status=status,
    )
