"""What a client meets before any route runs: unknown paths, wrong methods, and CORS for browsers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread

ERROR_KEYS = {"message", "type", "param", "code"}
ORIGIN = "https://app.example.com"


def test_an_unknown_path_is_a_404_naming_the_method_and_path(proxy_url):
    response = httpx.get(proxy_url + "/nope")
    assert response.status_code == 404
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["message"] == "Invalid URL (GET /v1/nope)"
    assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_url")


def test_an_unknown_path_with_a_trailing_slash_names_the_path_as_sent(proxy_url):
    error = httpx.post(proxy_url + "/threads/", json={}).json()["error"]
    assert error["message"] == "Invalid URL (POST /v1/threads/)"


@pytest.mark.parametrize("method", ["GET", "OPTIONS", "PUT"])
def test_a_method_a_route_does_not_serve_is_405_with_allow(proxy_url, method):
    response = httpx.request(method, proxy_url + "/chat/completions")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["type"] == "invalid_request_error" and error["code"] == "method_not_allowed"
    assert f"{method} /v1/chat/completions" in error["message"] and "POST" in error["message"]
    assert "access-control-allow-origin" not in response.headers  # no CORS unless configured


def test_without_cors_origins_there_are_no_cors_headers(proxy_url):
    response = httpx.get(proxy_url + "/models", headers={"origin": ORIGIN})
    assert response.status_code == 200
    assert not any(name.startswith("access-control-") for name in response.headers)


@pytest.fixture(params=[[ORIGIN], ["*"]], ids=["listed", "any"])
def cors_proxy(request, fake_upstream) -> Iterator[tuple[str, list[str]]]:
    settings = Settings(
        models=[{"name": "fake-small", "base_url": fake_upstream}],
        teams={"web": {"api_keys": ["sk-web"]}},
        server={"cors_origins": request.param},
        billing={"ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1", request.param


def _allowed_origin(origins: list[str]) -> str:
    return "*" if origins == ["*"] else ORIGIN


@pytest.mark.parametrize("path", ["/chat/completions", "/responses", "/models", "/chat/completions/"])
def test_a_preflight_is_answered_without_a_key(cors_proxy, path):
    url, origins = cors_proxy
    response = httpx.options(
        url + path,
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, x-switchyard-quality, x-stainless-os",
        },
    )
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == _allowed_origin(origins)
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed = response.headers["access-control-allow-headers"].lower()
    for header in ("authorization", "content-type", "x-switchyard-quality", "x-stainless-os"):
        assert header in allowed


def test_a_request_with_an_origin_can_read_the_answer_and_its_headers(cors_proxy):
    url, origins = cors_proxy
    body = {"model": "fake-small", "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(
        url + "/chat/completions", json=body, headers={"origin": ORIGIN, "authorization": "Bearer sk-web"}
    )
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == _allowed_origin(origins)
    exposed = {h.strip() for h in response.headers["access-control-expose-headers"].lower().split(",")}
    assert {"x-request-id", "x-switchyard-model", "x-switchyard-route", "x-switchyard-cost-usd"} <= exposed


def test_an_error_carries_cors_headers_so_the_browser_can_read_it(cors_proxy):
    url, origins = cors_proxy
    response = httpx.post(url + "/chat/completions", json={}, headers={"origin": ORIGIN})
    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == _allowed_origin(origins)
    assert set(response.json()["error"]) == ERROR_KEYS


def test_a_preflight_from_an_origin_not_listed_is_an_openai_shaped_400(fake_upstream):
    settings = Settings(
        models=[{"name": "fake-small", "base_url": fake_upstream}],
        server={"cors_origins": [ORIGIN]},
        billing={"ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        response = httpx.options(
            url + "/v1/chat/completions",
            headers={"origin": "https://evil.example.com", "access-control-request-method": "POST"},
        )
        simple = httpx.get(url + "/v1/models", headers={"origin": "https://evil.example.com"})
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS and "origin" in error["message"].lower()
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers


def test_options_without_a_preflight_header_is_still_405_with_cors_on(cors_proxy):
    url, _ = cors_proxy
    response = httpx.options(url + "/chat/completions", headers={"authorization": "Bearer sk-web"})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
