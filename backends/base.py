"""The interface every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, overload, runtime_checkable

from proxy.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    StreamChunk,
)

AnyRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class BackendHealth:
    is_ready: bool
    detail: str = ""


@runtime_checkable
class Backend(Protocol):
    """A deployment that answers OpenAI-shaped requests.

    `complete()` answers chat requests with a `ChatCompletion` and legacy completion requests with
    a `Completion`; `stream()` yields the upstream's chunks. Both raise `proxy.errors.BackendError`
    subclasses, and `stream()` raises them before its first chunk whenever it can.
    """

    name: str

    @overload
    async def complete(self, request: ChatCompletionRequest) -> ChatCompletion: ...
    @overload
    async def complete(self, request: CompletionRequest) -> Completion: ...
    async def complete(self, request: AnyRequest) -> ChatCompletion | Completion: ...

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
