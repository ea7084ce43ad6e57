"""What the current request carries through the layers that no argument reaches."""

from __future__ import annotations

from contextvars import ContextVar

answered_by: ContextVar[str | None] = ContextVar("switchyard_answered_by", default=None)
"""The deployment that took the current request, set by the backend when it picks one: its kind
and replica (`openai#0`, `vllm#1`; see `switchyard.core.urls.replica_label`), never its address.

Async generators run in their consumer's context, so a route reads this after `complete()`
returns or after the first streamed chunk arrives.
"""
