"""The model endpoints, served past FastAPI's router, answer as the router would have."""

from __future__ import annotations

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request, Response

from switchyard.billing.store.errors import StoreUnavailable
from switchyard.core.errors import InvalidRequest
from switchyard.proxy.error_handlers import install_error_handlers
from switchyard.proxy.middleware.trailing_slash import TrailingSlashMiddleware
from switchyard.proxy.routes.plain import PlainRoute, PlainRoutes, plain_endpoints

router = APIRouter(route_class=PlainRoute)


@router.post("/v1/echo")
async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/json")


@router.post("/v1/refuse")
async def refuse(request: Request) -> Response:
    raise InvalidRequest("no", param="model")


@router.post("/v1/store-down")
async def store_down(request: Request) -> Response:
    raise StoreUnavailable("sqlite:///x: locked")


@router.post("/v1/bug")
async def bug(request: Request) -> Response:
    raise RuntimeError("a bug")


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(PlainRoutes, endpoints=plain_endpoints([router]), fastapi=app)
    app.add_middleware(TrailingSlashMiddleware)
    return app


def test_only_plain_routes_are_served_directly() -> None:
    assert set(plain_endpoints([router])) == {
        ("POST", "/v1/echo"),
        ("POST", "/v1/refuse"),
        ("POST", "/v1/store-down"),
        ("POST", "/v1/bug"),
    }


async def test_the_app_answers_as_through_the_router() -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        echoed = await client.post("/v1/echo/", content=b'{"a": 1}')  # the trailing slash is taken off first
        assert (echoed.status_code, echoed.json()) == (200, {"a": 1})

        refused = await client.post("/v1/refuse")
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "model"

        down = await client.post("/v1/store-down")
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "database_unavailable"

        wrong_method = await client.get("/v1/echo")  # not served directly: the router's 405
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"

        assert (await client.post("/v1/nothing")).status_code == 404


async def test_an_unhandled_error_still_reaches_the_server_error_layer() -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with pytest.raises(RuntimeError, match="a bug"):
            await client.post("/v1/bug")
