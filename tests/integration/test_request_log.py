"""The request log: one parseable line per `/v1/` request, however it ends, and never a secret.

A proxy with two teams (keys) in front of two fake upstreams (each with an api_key) and a
cascade; every kind of request is sent once, then the captured log is read line by line.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.gateway.request_log import LOGGER_NAME, render
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, post_unread, wait_until

TEAM_KEY = "sk-team-alpha-7f3a9c2e51"
TIGHT_KEY = "sk-team-tight-0b8d44e6aa"
UPSTREAM_KEYS = {"cheap": "sk-upstream-cheap-c0ffee1234", "strong": "sk-upstream-strong-deadbeef99"}
SECRETS = (TEAM_KEY, TIGHT_KEY, *UPSTREAM_KEYS.values())
PROMPT = "What is the capital of Burkina Faso?"
HI = [{"role": "user", "content": PROMPT}]
FIELDS = {
    "time", "request_id", "method", "path", "status", "team", "key_id", "requested_model", "model", "backend",
    "route", "cascade", "stream", "outcome", "attempts", "prompt_tokens", "completion_tokens", "cost_usd",
    "ttft_ms", "ttfb_ms", "duration_ms",
}  # fmt: skip


@dataclass
class Proxy:
    base: str
    caplog: pytest.LogCaptureFixture

    def post(self, body: dict, key: str | None = TEAM_KEY) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        if body.get("stream"):
            url = self.base + "/v1/chat/completions"
            with httpx.stream("POST", url, json=body, headers=headers, timeout=20) as response:
                response.read()
            return response
        return httpx.post(self.base + "/v1/chat/completions", json=body, headers=headers, timeout=20)

    def lines(self) -> list[str]:
        return [r.getMessage() for r in self.caplog.records if r.name == LOGGER_NAME]

    def line_of(self, response: httpx.Response) -> dict:
        request_id = response.headers["x-request-id"]

        def mine() -> list[dict]:
            return [entry for entry in map(orjson.loads, self.lines()) if entry["request_id"] == request_id]

        assert wait_until(lambda: mine(), timeout_s=30), f"no log line for {request_id}: {self.lines()}"
        [entry] = mine()  # exactly one
        return entry


def _settings(urls: dict[str, str], **logging_settings) -> Settings:
    price = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    return Settings(
        models=[
            {"name": name, "base_url": url, "api_key": UPSTREAM_KEYS[name], "price": price}
            for name, url in urls.items()
        ],
        cascade={"ladder": ["cheap", "strong"], "scorer": "mean_logprob", "threshold": -0.5},
        resilience={"max_attempts": 1},
        billing={"ledger_path": None},
        teams={"alpha": {"api_keys": [TEAM_KEY]}, "tight": {"api_keys": [TIGHT_KEY], "rpm": 1}},
        logging=logging_settings,
    )


@pytest.fixture
def upstreams() -> Iterator[tuple[dict[str, FakeState], dict[str, str]]]:
    states = {"cheap": FakeState(), "strong": FakeState(behaviour=FakeBehaviour(words=("strong1", "strong2")))}
    states["cheap"].behaviour.logprobs = [-2.0]  # unsure: the cascade climbs
    with ExitStack() as stack:
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
        yield states, urls


def _proxy(stack: ExitStack, urls: dict[str, str], caplog, **logging_settings) -> Proxy:
    caplog.set_level(logging.DEBUG)
    return Proxy(stack.enter_context(serve_in_thread(create_app(_settings(urls, **logging_settings)))), caplog)


def test_one_line_per_request_with_its_fields_and_no_secret(upstreams, caplog):
    states, urls = upstreams
    with ExitStack() as stack:
        proxy = _proxy(stack, urls, caplog)
        explicit = proxy.post({"model": "cheap", "messages": HI})
        streamed = proxy.post({"model": "cheap", "messages": HI, "stream": True})
        cascade = proxy.post({"model": "cascade", "messages": HI})
        failed = proxy.post({"model": "cheap", "messages": HI, "fake": {"failure": "500"}})
        no_key = proxy.post({"model": "cheap", "messages": HI}, key=None)
        bad_body = proxy.post({"model": "cheap"})
        proxy.post({"model": "cheap", "messages": HI}, key=TIGHT_KEY)
        limited = proxy.post({"model": "cheap", "messages": HI}, key=TIGHT_KEY)
        assert [r.status_code for r in (explicit, streamed, cascade, failed, no_key, bad_body, limited)] == [
            200, 200, 200, 502, 401, 400, 429,
        ]  # fmt: skip

        line = proxy.line_of(explicit)
        assert FIELDS <= line.keys()
        assert line["status"] == 200 and line["team"] == "alpha" and line["key_id"]
        assert (line["requested_model"], line["model"], line["backend"]) == ("cheap", "cheap", "openai#0")
        assert line["outcome"] == "completed" and line["attempts"] == ["cheap:completed"]
        assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0 and line["cost_usd"] > 0
        # asked of the upstream as a stream and assembled (the default): its first chunk is known
        assert line["ttft_ms"] is not None and line["duration_ms"] >= line["ttft_ms"] and not line["stream"]
        assert line["ttfb_ms"] > 0  # a whole answer's first byte is its last: written at once
        assert float(explicit.headers["x-switchyard-cost-usd"]) == pytest.approx(line["cost_usd"])
        assert "prompt" not in line

        line = proxy.line_of(streamed)
        assert line["stream"] and line["status"] == 200 and line["outcome"] == "completed"
        assert line["ttft_ms"] is not None and line["completion_tokens"] > 0
        assert 0 < line["ttfb_ms"] <= line["duration_ms"]  # its first chunk, as the client saw it

        line = proxy.line_of(cascade)
        assert (line["requested_model"], line["model"]) == ("cascade", "strong")
        assert line["route"] == cascade.headers["x-switchyard-route"]
        assert line["cascade"] == cascade.headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->strong"
        assert line["attempts"] == ["cheap:escalated", "strong:completed"]
        assert line["ttft_ms"] is not None  # the answering rung's, assembled from its stream

        line = proxy.line_of(failed)
        assert line["status"] == 502 and line["attempts"] == ["cheap:failed"] and line["outcome"] is None

        line = proxy.line_of(no_key)
        assert line["status"] == 401 and line["team"] is None and line["key_id"] is None

        line = proxy.line_of(bad_body)
        assert line["status"] == 400 and line["team"] == "alpha" and line["attempts"] == []
        assert line["ttfb_ms"] is None  # refused before the relay

        line = proxy.line_of(limited)
        assert line["status"] == 429 and line["team"] == "tight" and line["requested_model"] == "cheap"

        assert wait_until(lambda: len(proxy.lines()) == 8, timeout_s=30), proxy.lines()  # the first tight one's too
        httpx.get(proxy.base + "/health/live")  # not an API request: no line
        everything = caplog.text + "\n".join(str(r.__dict__) for r in caplog.records)
        for secret in SECRETS:
            assert secret not in everything
        assert PROMPT not in everything
        assert states["cheap"].records[0].headers["authorization"] == f"Bearer {UPSTREAM_KEYS['cheap']}"
    assert len(proxy.lines()) == 8


def test_prompts_are_logged_only_when_asked_for(upstreams, caplog):
    _, urls = upstreams
    with ExitStack() as stack:
        proxy = _proxy(stack, urls, caplog, prompts=True)
        line = proxy.line_of(proxy.post({"model": "cheap", "messages": HI}))
    assert line["prompt"] == {"messages": HI}


def test_the_text_format_and_the_switch(upstreams, caplog):
    _, urls = upstreams
    with ExitStack() as stack:
        proxy = _proxy(stack, urls, caplog, format="text")
        response = proxy.post({"model": "cheap", "messages": HI})
        assert wait_until(proxy.lines, timeout_s=30)
        [line] = proxy.lines()
        assert f"request_id={response.headers['x-request-id']}" in line and "status=200" in line
        assert 'attempts=["cheap:completed"]' in line
        silent = _proxy(stack, urls, caplog, requests=False)
        silent.post({"model": "cheap", "messages": HI})
    assert len(proxy.lines()) == 1


def test_a_client_that_leaves_gets_its_line_too(upstreams, caplog):
    """Mid-stream: the status was 200, the answer was cancelled; before the first byte: 499."""
    states, urls = upstreams
    with ExitStack() as stack:
        proxy = _proxy(stack, urls, caplog)
        # 10,000 tokens 0.05 s apart: still streaming when the client leaves, however slow the machine
        states["cheap"].behaviour.num_tokens = 10_000
        states["cheap"].behaviour.token_delay_s = 0.05
        body = {"model": "cheap", "messages": HI, "stream": True}
        headers = {"authorization": f"Bearer {TEAM_KEY}", "x-request-id": "left-mid-stream"}
        with httpx.stream("POST", proxy.base + "/v1/chat/completions", json=body, headers=headers) as response:
            lines = response.iter_lines()
            [next(lines) for _ in range(3)]
        line = proxy.line_of(response)
        assert (line["status"], line["outcome"], line["client_request_id"]) == (200, "cancelled", "left-mid-stream")
        assert line["attempts"] == ["cheap:cancelled"] and 0 < line["completion_tokens"] < 10_000

        states["strong"].behaviour.failure = "hang"  # never answers
        headers = {"authorization": f"Bearer {TEAM_KEY}", "x-request-id": "left-early"}
        with post_unread(proxy.base, {"model": "strong", "messages": HI}, headers) as sock:
            assert wait_until(states["strong"].arrived.is_set, timeout_s=30)  # at the model
            assert not select.select([sock], [], [], 0)[0]  # and not a byte of an answer: the client leaves

        def early() -> list[dict]:
            return [x for x in map(orjson.loads, proxy.lines()) if x["client_request_id"] == "left-early"]

        assert wait_until(early, timeout_s=30)
        [line] = early()
        assert line["status"] == 499 and line["attempts"] == ["strong:cancelled"]


def test_credentials_in_a_url_are_masked_in_the_line():
    line = render({"route": "to http://bob:s3cret@10.0.0.1/v1", "attempts": []}, "json")
    assert "s3cret" not in line and "bob:***@" in line
    assert "s3cret" not in render({"route": "http://bob:s3cret@h/v1"}, "text")


@pytest.mark.slow
def test_switchyard_serve_writes_the_lines_to_stdout(tmp_path, upstreams):
    """The real command: its whole output holds one JSON line per request and no key."""
    _, urls = upstreams
    lines = [
        "teams:",
        f"  alpha: {{api_keys: [{TEAM_KEY}]}}",
        "models:",
        *(f"  - {{name: {n}, base_url: '{u}', api_key: {UPSTREAM_KEYS[n]}}}" for n, u in urls.items()),
    ]
    config = tmp_path / "switchyard.yaml"
    config.write_text("\n".join(lines) + "\n")
    port = closed_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port)]
    with log.open("wb") as out, subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT) as process:
        try:
            assert wait_until(lambda: _is_live(base), timeout_s=PROCESS_BOUND_S), log.read_text()
            proxy = Proxy(base, caplog=None)  # type: ignore[arg-type]
            ids = [
                proxy.post({"model": "cheap", "messages": HI}).headers["x-request-id"],
                proxy.post({"model": "strong", "messages": HI, "stream": True}).headers["x-request-id"],
                proxy.post({"model": "cheap", "messages": HI}, key="sk-not-a-key").headers["x-request-id"],
            ]

            def logged() -> list[dict]:
                text = log.read_text()
                return [orjson.loads(x) for x in text.splitlines() if x.startswith("{") and '"request_id"' in x]

            assert wait_until(lambda: len(logged()) == 3, timeout_s=30), log.read_text()
            assert [(x["request_id"], x["status"]) for x in logged()] == list(zip(ids, [200, 200, 401], strict=True))
        finally:
            process.terminate()
            process.wait(timeout=PROCESS_BOUND_S)
    text = log.read_text()
    for secret in (TEAM_KEY, "sk-not-a-key", *UPSTREAM_KEYS.values()):
        assert secret not in text
    assert PROMPT not in text


def _is_live(base: str) -> bool:
    try:
        return httpx.get(base + "/health/live").status_code == 200
    except httpx.TransportError:
        return False
