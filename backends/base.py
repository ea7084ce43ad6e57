"""The interface every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from proxy.protocol import ChatCompletionRequest, CompletionRequest, CompletionResult, StreamChunk

AnyRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class BackendHealth:
    is_ready: bool
    detail: str = ""


@runtime_checkable
class Backend(Protocol):
    """A deployment that answers OpenAI-shaped requests.

    `complete()` answers a chat request with a `ChatCompletion` and a legacy completion request with
    a `Completion`, both carried as a `CompletionResult` (the upstream's bytes, parsed on demand,
    `as_chat_completion()` for the typed model). `stream()` yields the upstream's chunks. Both raise
    `proxy.errors.BackendError` subclasses; `stream()` raises before its first chunk when it can.
    """

    name: str

    async def complete(self, request: AnyRequest) -> CompletionResult: ...

    def stream(self, request: AnyRequest) -> AsyncIterator[StreamChunk]: ...

    async def health(self) -> BackendHealth: ...

    def is_ready(self) -> bool:
        """The last health verdict, without probing."""
        ...

    async def aclose(self) -> None: ...


answered_by: ContextVar[str | None] = ContextVar("switchyard_answered_by", default=None)
"""The deployment that took the current request, set by the backend when it picks one.

Async generators run in their consumer's context, so a route reads this after `complete()`
returns or after the first streamed chunk arrives.
"""
