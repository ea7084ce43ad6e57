"""How an exception reaches the client: one body per error, in the shape of the API it came in by
(`error_response.errors_of`), never a stack trace."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchyard.billing.store.errors import StoreConflict, StoreError, StoreNotFound, StoreUnavailable
from switchyard.core.errors import (
    Conflict,
    DatabaseUnavailable,
    InvalidRequest,
    NotFound,
    RequestTooLarge,
    SwitchyardError,
)
from switchyard.proxy.error_response import error_response, errors_of
from switchyard.proxy.exchange import not_routed
from switchyard.proxy.middleware.trailing_slash import PATH_AS_SENT

logger = logging.getLogger("switchyard.errors")


_HTTP_STATUS_TO_ERROR: dict[int, type[SwitchyardError]] = {
    400: InvalidRequest,
    413: RequestTooLarge,
}


async def _handle_switchyard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SwitchyardError)
    if exc.status_code >= 500:
        logger.warning("%s: %s", type(exc).__name__, exc.log_message)
    return error_response(exc, errors_of(request.url.path))


def _routing_error(request: Request, exc: StarletteHTTPException) -> SwitchyardError:
    """The router's own 404 and 405 (no route has this path; none serves this method), worded as
    OpenAI words them, with the path as the client sent it (a trailing slash included)."""
    path = request.scope.get(PATH_AS_SENT, request.url.path)
    if exc.status_code == 404:
        return InvalidRequest(f"Invalid URL ({request.method} {path})", code="unknown_url")
    allowed = (exc.headers or {}).get("Allow", "")
    return InvalidRequest(
        f"Method not allowed ({request.method} {path}); this endpoint serves {allowed or 'no method'}.",
        code="method_not_allowed",
    )


async def _handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code in (404, 405):
        error = _routing_error(request, exc)
        if request.url.path.startswith("/v1/") and getattr(request.app.state, "services", None) is not None:
            not_routed(request, exc.status_code)
    else:
        error = _HTTP_STATUS_TO_ERROR.get(exc.status_code, SwitchyardError)(str(exc.detail), code=None)
    error.status_code = exc.status_code
    response = error_response(error, errors_of(request.url.path))
    response.headers.update(exc.headers or {})  # a 405's `Allow`
    return response


async def _handle_store_error(request: Request, exc: Exception) -> Response:
    """The database behind usage, teams and keys: down or slow is a 503 (its address stays in the log)."""
    shape = errors_of(request.url.path)
    if isinstance(exc, StoreUnavailable):
        logger.warning("database unavailable: %s", exc)
        return error_response(
            DatabaseUnavailable("The usage database is unavailable; try again shortly.", retry_after_s=1), shape
        )
    if isinstance(exc, StoreConflict):
        return error_response(Conflict(str(exc)), shape)
    if isinstance(exc, StoreNotFound):
        return error_response(NotFound(str(exc)), shape)
    logger.error("database error: %s", exc)
    return error_response(SwitchyardError("The usage database had an error."), shape)


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error", exc_info=exc)
    return error_response(SwitchyardError("The server had an internal error."), errors_of(request.url.path))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SwitchyardError, _handle_switchyard_error)
    app.add_exception_handler(StarletteHTTPException, _handle_http_exception)
    app.add_exception_handler(StoreError, _handle_store_error)
    app.add_exception_handler(Exception, _handle_unexpected)
