"""A bug in a backend is a clean OpenAI-shaped 500 (or an in-band error), never a stack trace."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx

from switchyard.backends.base import Backend, BackendHealth
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

WAIT_S = 30.0  # a generous bound on what the tests wait for: it only catches a hang


class BrokenBackend(Backend):
    name = "broken"

    async def complete(self, request, pick=None):
        raise RuntimeError("secret internal detail")

    async def stream(self, request, pick=None) -> AsyncIterator[StreamChunk]:
        yield StreamChunk(b'{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}')
        raise RuntimeError("secret internal detail")

    async def health(self) -> BackendHealth:
        return BackendHealth(is_ready=True)

    def is_ready(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


@contextmanager
def _client(app) -> Iterator[httpx.Client]:
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as client:
        yield client


BODY = {"model": "broken", "messages": [{"role": "user", "content": "hi"}]}


def _broken_app():
    settings = Settings(models=[{"name": "broken", "base_url": "http://127.0.0.1:1/v1"}], billing={"ledger_path": None})
    return create_app(settings, backends={"broken": BrokenBackend()})


def test_unexpected_exception_is_an_openai_500():
    with _client(_broken_app()) as client:
        response = client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "The server had an internal error.",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret" not in response.text
    assert response.headers["x-request-id"].startswith("req_")


def test_unexpected_exception_mid_stream_goes_in_band():
    with _client(_broken_app()) as client:
        response = client.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert response.status_code == 200
    events = [line for line in response.text.split("\n") if line]
    assert events[0].startswith('data: {"choices"')
    assert '"code":"internal_error"' in events[1]
    assert events[-1] == "data: [DONE]"
    assert "secret" not in response.text


def test_the_proxy_ids_each_request_and_echoes_the_clients_id_beside_it():
    app = create_app(Settings())
    with _client(app) as client:
        response = client.get("/health/live", headers={"x-request-id": "abc-123"})
        bad = client.get("/health/live", headers={"x-request-id": "x" * 200})
    assert response.headers["x-request-id"].startswith("req_")
    assert response.headers["x-client-request-id"] == "abc-123"
    assert "x-client-request-id" not in bad.headers  # not sane: not kept


def test_ready_is_503_without_models():
    app = create_app(Settings())
    with _client(app) as client:
        response = client.get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["models"], body["breakers"]) == ("not_ready", {}, {})
    assert body["ledger"]["behind"] is False


def test_an_aborted_upload_is_one_log_line_not_a_traceback(caplog):
    import logging
    import socket

    app = create_app(Settings(billing={"ledger_path": None}))
    with caplog.at_level(logging.INFO, logger="switchyard"), serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"model":'
            )
            # the handler is running (so waiting for the rest of the body) when the client goes
            assert wait_until(lambda: len(app.state.in_flight.tasks) == 1, timeout_s=WAIT_S)
        assert wait_until(lambda: any("left before its body" in r.getMessage() for r in caplog.records), WAIT_S)
    ours = [r for r in caplog.records if r.name.startswith("switchyard") and "left before its body" in r.getMessage()]
    assert len(ours) == 1 and ours[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info is not None]


class FlakyHealthBackend(BrokenBackend):
    """Its first health probe raises (as aiohttp's ValueError did for a base_url with credentials
    plus an api_key, which killed the health watcher without a word)."""

    def __init__(self) -> None:
        self.num_probes = 0

    async def health(self) -> BackendHealth:
        self.num_probes += 1
        if self.num_probes == 1:
            raise ValueError("Cannot combine AUTHORIZATION header with AUTH argument or credentials encoded in URL")
        return BackendHealth(is_ready=True)


def test_a_health_watcher_that_dies_is_logged_restarted_and_shown_in_readiness(caplog):
    backend = FlakyHealthBackend()
    settings = Settings(
        models=[{"name": "broken", "base_url": "http://127.0.0.1:1/v1"}],
        upstream={"health_interval_s": 0.05},
        billing={"ledger_path": None},
    )
    app = create_app(settings, backends={"broken": backend})
    with _client(app) as client:
        assert wait_until(
            lambda: client.get("/health/ready").json()["tasks"]["health-watcher"]["restarts"] == 1, WAIT_S
        )
        watcher = client.get("/health/ready").json()["tasks"]["health-watcher"]
        assert watcher["last_error"] == "ValueError"
        assert wait_until(lambda: backend.num_probes >= 3, WAIT_S)  # probing again after the restart
        assert client.get("/health/ready").json()["tasks"]["health-watcher"]["state"] == "running"
    died = [r for r in caplog.records if "background task health-watcher died" in r.getMessage()]
    assert died and died[0].exc_info is not None


class FailingStartBackend(BrokenBackend):
    async def start(self) -> None:
        raise RuntimeError("could not connect")


def test_a_backend_start_that_fails_is_logged_with_its_traceback(caplog):
    settings = Settings(models=[{"name": "broken", "base_url": "http://127.0.0.1:1/v1"}], billing={"ledger_path": None})
    app = create_app(settings, backends={"broken": FailingStartBackend()})
    with _client(app) as client:
        assert client.get("/health/live").status_code == 200
        assert wait_until(lambda: any("start:broken failed" in r.getMessage() for r in caplog.records), WAIT_S)
    [failed] = [r for r in caplog.records if "start:broken failed" in r.getMessage()]
    assert failed.levelno == logging.ERROR and failed.exc_info is not None


def test_a_body_shorter_than_its_content_length_is_a_400_after_the_body_deadline():
    import socket

    app = create_app(Settings(server={"body_timeout_s": 0.5}, billing={"ledger_path": None}))
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"model":'
            )
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                data = sock.recv(65536)  # the socket's timeout is the guard against a hang
                if not data:
                    break
                reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    error = httpx.Response(400, content=body).json()["error"]
    assert error["code"] == "body_timeout" and "server.body_timeout_s" in error["message"]
    assert "9 of 100 bytes" in error["message"]
