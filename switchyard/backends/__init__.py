"""Backends: where a request is answered."""

from switchyard.backends.base import Backend, BackendHealth
from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica

__all__ = ["Backend", "BackendHealth", "OpenAIHTTPBackend", "Replica"]
