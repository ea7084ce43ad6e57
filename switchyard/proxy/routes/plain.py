"""The route class of the model endpoints, and the middleware that serves them directly.

FastAPI's own handler solves the endpoint's dependencies and validates its parameters for every
request; a model endpoint has neither (it reads and validates its body itself, `proxy/body.py`),
so its handler is the endpoint.

Under load, the framework around that handler cost more than a tenth of a request's CPU: the
router tries each route's pattern in turn, and four layers (exception middleware, exit stacks,
`request_response`) wrap every call. `PlainRoutes` answers the model endpoints' exact path and
method itself, inside the app's own middleware (request ids, tracing, CORS, trailing slash), and
hands their exceptions to the app's handlers as the framework would; everything else, a wrong
method included, goes on to FastAPI. The routes stay registered there, for the OpenAPI document.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]
Handler = Callable[[Request, Any], Any]  # async, or sync (run in the thread pool, as Starlette does)


class PlainRoute(APIRoute):
    def get_route_handler(self) -> Endpoint:
        return self.endpoint  # type: ignore[no-any-return]


def plain_endpoints(routers: Iterable[APIRouter]) -> dict[tuple[str, str], Endpoint]:
    """(method, path) → endpoint, for every `PlainRoute` of `routers` (included without a prefix;
    none has path parameters)."""
    return {
        (method, route.path): route.endpoint
        for router in routers
        for route in router.routes
        if isinstance(route, PlainRoute) and not route.param_convertors
        for method in route.methods or ()
    }


class PlainRoutes:
    """Serves the `PlainRoute` endpoints without the router; the innermost of the app's middleware."""

    def __init__(self, app: ASGIApp, endpoints: Mapping[tuple[str, str], Endpoint], fastapi: FastAPI) -> None:
        self.app = app
        self.endpoints = endpoints
        self.fastapi = fastapi

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self.endpoints.get((scope.get("method", ""), scope.get("path", ""))) if scope["type"] == "http" else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = self._handler_of(exc)
            if handler is None:
                raise
            if inspect.iscoroutinefunction(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
        await response(scope, receive, send)

    def _handler_of(self, exc: Exception) -> Handler | None:
        """The app's handler for `exc`, as Starlette's exception middleware picks it (by class,
        nearest first); `Exception`'s own is the server-error layer's, outside this one."""
        handlers = self.fastapi.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in handlers:
                return handlers[cls]
        return None
