"""Property-based fuzzing of the OpenAPI document with schemathesis, against the proxy served for real.

The proxy runs on 127.0.0.1 in front of a healthy fake upstream, with one team and an admin key
(and the batch tier on a real Valkey).
Every operation in `/openapi.json` gets requests that fit its schema and requests that do not
(deterministic: the same examples on every run): with the team's key (the admin key for
`/admin`), and again without a key. Whatever comes back: no 5xx, every refusal is the API's error
shape as JSON (OpenAI's; Anthropic's under /v1/messages), and each answer matches what the document says for its status.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

TEAM_KEY = "sk-fuzz-team"
ADMIN_KEY = "sk-fuzz-admin"
MODEL = "fake-small"
OPEN_PATHS = ("/health/live", "/health/ready")  # served without a key (/metrics too, but not here: keys are set)
ERROR_KEYS = {"message", "type", "param", "code"}
ANTHROPIC_ERROR_TYPES = {  # Anthropic's error type for each status (docs/anthropic.md)
    **{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"},
    **{404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error"},
    **{500: "api_error", 502: "api_error", 504: "timeout_error", 529: "overloaded_error"},
}
MAX_EXAMPLES = 15  # per operation and test, besides the coverage phase: both tests take about 30-60 s


@pytest.fixture(scope="module")
def fuzzed_proxy(tmp_path_factory, valkey_session) -> Iterator[str]:
    database = tmp_path_factory.mktemp("fuzz") / "usage.db"
    with serve_in_thread(FakeOpenAIUpstream()) as upstream:
        settings = Settings(
            models=[{"name": MODEL, "backend": "openai", "base_url": upstream + "/v1", "context_window": 4096}],
            teams={"fuzz": {"api_keys": [TEAM_KEY]}},
            auth={"admin_key": ADMIN_KEY},
            billing={"database_url": f"sqlite:///{database}", "redis_url": valkey_session.url},  # the batch tier
            # a health probe late on a busy machine must not make the model unready (a 503)
            upstream={"health_interval_s": 0.5, "health_timeout_s": 30},
        )
        with serve_in_thread(create_app(settings)) as url:
            assert wait_until(lambda: httpx.get(url + "/health/ready", timeout=30).status_code == 200, timeout_s=30)
            yield url


def _load_schema():
    """The document the app serves (it depends on no setting; `test_the_served_document_is_the_one_fuzzed`
    holds them equal), loaded without a server so that pytest can name one test per operation."""
    app = create_app(Settings(models=[{"name": MODEL, "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}]))
    loaded = schemathesis.openapi.from_dict(app.openapi())
    loaded.config.generation.update(
        max_examples=MAX_EXAMPLES, deterministic=True, database="none", with_security_parameters=False
    )
    return loaded


schema = _load_schema()


def test_the_served_document_is_the_one_fuzzed(fuzzed_proxy: str):
    assert httpx.get(fuzzed_proxy + "/openapi.json").json() == schema.raw_schema


@schemathesis.check
def api_error_shape(ctx, response, case) -> bool | None:
    """A refusal is `{"error": {"message": str, "type": str, "param": str|null, "code": str|null}}`
    as application/json; under `/v1/messages`, Anthropic's `{"type": "error", "error": {"type": str,
    "message": str}}`."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), f"{response.status_code} as {content_type!r}"
    body = response.json()
    if case.path == "/v1/messages" or case.path.startswith("/v1/messages/"):
        assert isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error", body
        error = body["error"]
        assert isinstance(error, dict) and set(error) == {"type", "message"}, error
        assert error["type"] == ANTHROPIC_ERROR_TYPES[response.status_code], (response.status_code, error)
        assert isinstance(error["message"], str) and error["message"], error
        return True
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return True


CHECKS = [
    not_a_server_error,
    api_error_shape,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    unsupported_method,
]


def _for_the_served_model(case) -> None:
    """Half the bodies name the model that is served, so that valid ones reach the upstream
    (a random name is a 404 before anything else happens); which half is fixed by the body."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str) and len(repr(body)) % 2 == 0:
        body["model"] = MODEL
    if isinstance(body, dict):
        body.pop("fake", None)  # the fake upstream's own script field


FUZZ_SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck))


def _not_on_an_xdist_worker() -> None:
    """schemathesis reports each operation as a subtest, and pytest-xdist carries no subtest report:
    on a worker a failing operation would pass unseen. `make test` runs these in a process of their own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("the fuzz tests are marked `serial`: run them without -n (pytest -m serial)")


@pytest.mark.slow
@pytest.mark.serial
@schema.parametrize()
@FUZZ_SETTINGS
def test_fuzz_with_a_key(fuzzed_proxy, case):
    _not_on_an_xdist_worker()
    _for_the_served_model(case)
    key = ADMIN_KEY if case.path.startswith("/admin") or case.path == "/metrics" else TEAM_KEY
    response = case.call(base_url=fuzzed_proxy, headers={"authorization": f"Bearer {key}"}, timeout=30)
    case.validate_response(response, checks=[*CHECKS, negative_data_rejection])


@pytest.mark.slow
@pytest.mark.serial
@schema.parametrize()
@FUZZ_SETTINGS
def test_fuzz_without_a_key(fuzzed_proxy, case):
    _not_on_an_xdist_worker()
    _for_the_served_model(case)
    response = case.call(base_url=fuzzed_proxy, timeout=30)
    case.validate_response(response, checks=CHECKS)
    is_documented_method = case.method.upper() == case.operation.method.upper()
    if case.path.startswith("/admin") or (case.path not in OPEN_PATHS and is_documented_method):
        assert response.status_code == 401, response.text


# --- What the fuzzing found, each pinned by a test of its own -------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("budget_usd_per_month", False), ("budget_usd_per_day", "10"), ("rpm", "10"), ("tpm", 1.5), ("models", "m")],
)
def test_admin_numbers_and_lists_have_strict_types(fuzzed_proxy, field, value):
    """`false` was taken as a budget of 0 (the team could spend nothing), `"10"` as 10."""
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(fuzzed_proxy + "/admin/teams", json={"name": f"strict-{field}", field: value}, headers=admin)
    assert created.status_code == 400, created.text
    assert created.json()["error"]["code"] == "invalid_type"
    assert created.json()["error"]["param"] == field
    changed = httpx.patch(fuzzed_proxy + "/admin/teams/fuzz", json={field: value}, headers=admin)
    assert changed.status_code == 400, changed.text
    key = httpx.post(fuzzed_proxy + "/admin/keys", json={"team": "fuzz", field: value}, headers=admin)
    assert key.status_code == 400, key.text


@pytest.mark.parametrize("method", ["TRACE", "QUERY", "PROPFIND"])
def test_any_method_under_admin_without_the_admin_key_is_401(fuzzed_proxy, method):
    """TRACE and QUERY were 405 before the key was checked."""
    response = httpx.request(method, fuzzed_proxy + "/admin/teams")
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_405_names_the_methods_allowed(fuzzed_proxy):
    """RFC 9110: a 405 carries `Allow` (it was dropped on the way to OpenAI's shape)."""
    response = httpx.get(fuzzed_proxy + "/v1/chat/completions", headers={"authorization": f"Bearer {TEAM_KEY}"})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert set(response.json()["error"]) == ERROR_KEYS


@pytest.mark.parametrize("method", ["PUT", "TRACE"])
def test_a_method_an_admin_endpoint_does_not_serve_is_405_with_the_admin_key(fuzzed_proxy, method):
    """It was a 404 "No admin endpoint", as if the path did not exist."""
    response = httpx.request(method, fuzzed_proxy + "/admin/teams", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 405, response.text
    assert set(response.headers["allow"].split(", ")) >= {"GET", "POST"}
    assert set(response.json()["error"]) == ERROR_KEYS
