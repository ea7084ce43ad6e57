"""No secret or address leaves the process: credentials in a `base_url` become the upstream's auth,
and clients, the ledger and the logs name a deployment `openai#0`, never by its URL."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_for_records

PASSWORD = "hunter2/Pa55"  # written percent-encoded in the URL, so both spellings must stay inside
ENCODED_PASSWORD = "hunter2%2FPa55"
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Guarded:
    base: str  # the proxy
    state: FakeState  # the upstream behind "guarded"
    app: object
    addresses: tuple[str, ...]  # host:port of every upstream, reachable or not
    caplog: pytest.LogCaptureFixture

    def post(self, model: str, **body) -> httpx.Response:
        response = httpx.post(self.base + "/v1/chat/completions", json={"model": model, "messages": HI, **body})
        self.assert_clean(response)
        return response

    def assert_clean(self, response: httpx.Response) -> None:
        seen = "\n".join(f"{k}: {v}" for k, v in response.headers.items()) + "\n" + response.text
        self.assert_no_secret(seen)
        for address in self.addresses:
            assert address not in seen, f"{address} reached the client: {seen}"

    @staticmethod
    def assert_no_secret(text: str) -> None:
        assert PASSWORD not in text and ENCODED_PASSWORD not in text and "hunter2" not in text, text


@pytest.fixture
def guarded(tmp_path, caplog) -> Iterator[Guarded]:
    caplog.set_level(logging.DEBUG)
    state = FakeState()
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state)))
        address = upstream.removeprefix("http://")
        down = f"127.0.0.1:{closed_port()}"
        settings = Settings(
            models=[
                {"name": "guarded", "base_url": f"http://alice:{ENCODED_PASSWORD}@{address}/v1"},
                {"name": "guarded-down", "base_url": f"http://alice:{ENCODED_PASSWORD}@{down}/v1"},
            ],
            resilience={"max_attempts": 1},
            upstream={"health_interval_s": 0.2},
            billing={"ledger_path": tmp_path / "usage.db"},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        yield Guarded(base, state, app, (address, down), caplog)


def test_credentials_in_base_url_go_upstream_as_basic_auth(guarded):
    response = guarded.post("guarded")
    assert response.status_code == 200
    assert response.headers["x-switchyard-backend"] == "openai#0"
    sent = guarded.state.records[-1].headers
    assert sent["authorization"] == "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()


def test_a_stream_names_the_deployment_not_its_url(guarded):
    with httpx.stream(
        "POST", guarded.base + "/v1/chat/completions", json={"model": "guarded", "messages": HI, "stream": True}
    ) as response:
        response.read()
    guarded.assert_clean(response)
    assert response.headers["x-switchyard-backend"] == "openai#0"
    assert guarded.state.records[-1].headers["authorization"].startswith("Basic ")


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_upstream_is_named_by_its_label(guarded, stream):
    response = guarded.post("guarded-down", stream=stream)
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert "openai#0" in message and "unreachable" in message


def test_an_upstream_error_is_clean(guarded):
    response = guarded.post("guarded", fake={"failure": "500"})
    assert response.status_code == 502
    assert "broke on purpose" in response.json()["error"]["message"]


def test_a_stream_cut_mid_way_says_so_in_band_without_the_url(guarded):
    response = guarded.post("guarded", stream=True, fake={"failure": "drop", "drop_after": 2})
    events = [line for line in response.text.split("\n") if line]
    assert '"error"' in events[-2] and "openai#0" in events[-2] and events[-1] == "data: [DONE]"


def test_ledger_rows_name_the_deployment(guarded):
    ids = [
        guarded.post("guarded").headers["x-request-id"],
        guarded.post("guarded-down").headers["x-request-id"],
        guarded.post("guarded", stream=True, fake={"failure": "drop"}).headers["x-request-id"],
    ]
    records = [r for request_id in ids for r in wait_for_records(guarded.app, 1, timeout_s=30, request_id=request_id)]
    assert [(r.model, r.backend, r.status) for r in records] == [
        ("guarded", "openai#0", "completed"),
        ("guarded-down", "openai#0", "failed"),
        ("guarded", "openai#0", "failed"),
    ]
    for record in records:
        text = repr(record)
        guarded.assert_no_secret(text)
        assert not any(address in text for address in guarded.addresses), text


def test_health_metrics_and_models_are_clean(guarded):
    for path in ("/health/ready", "/metrics", "/v1/models"):
        guarded.assert_clean(httpx.get(guarded.base + path))


def test_the_logs_never_hold_the_password(guarded):
    guarded.post("guarded")
    guarded.post("guarded-down")
    guarded.post("guarded-down", stream=True)
    guarded.post("guarded", stream=True, fake={"failure": "drop"})
    guarded.post("guarded", fake={"failure": "500"})
    httpx.get(guarded.base + "/health/ready")
    text = guarded.caplog.text + "\n".join(str(r.__dict__) for r in guarded.caplog.records)
    assert "guarded-down" in text  # the logs did see the failures …
    guarded.assert_no_secret(text)  # … and never the password


def test_credentials_in_url_and_an_api_key_are_refused_naming_the_model():
    with pytest.raises(ValueError, match="model 'both': base_url carries credentials") as info:
        Settings(models=[{"name": "both", "base_url": "http://u:p@127.0.0.1:1/v1", "api_key": "sk-x"}])
    assert "u:p" not in str(info.value)
    with pytest.raises(ValueError, match=r"model 'pair': replicas\[1\]\.base_url carries credentials"):
        Settings(
            models=[
                {
                    "name": "pair",
                    "replicas": [
                        {"base_url": "http://127.0.0.1:1/v1", "api_key": "sk-a"},
                        {"base_url": "http://u:p@127.0.0.1:2/v1", "api_key": "sk-b"},
                    ],
                }
            ]
        )
