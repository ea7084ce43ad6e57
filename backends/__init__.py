"""Backends: where a request is answered."""

from backends.base import Backend, BackendHealth
from backends.openai_http import OpenAIHTTPBackend, Replica

__all__ = ["Backend", "BackendHealth", "OpenAIHTTPBackend", "Replica"]
