"""The route class of the model endpoints: the endpoint takes the `Request` and returns a `Response`.

FastAPI's own handler solves the endpoint's dependencies and validates its parameters for every
request; a model endpoint has neither (it reads and validates its body itself, `proxy/body.py`),
so its handler is the endpoint. The route is otherwise FastAPI's: matched, documented in the
OpenAPI document and wrapped in the app's exception handlers the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


class PlainRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return self.endpoint  # type: ignore[no-any-return]
