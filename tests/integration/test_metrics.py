"""`/metrics` through the proxy: the contract's families before any traffic, then what explicit,
auto, cascade, streamed and failed requests leave in them, read back with prometheus_client's parser."""

from __future__ import annotations

import select
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.estimates import worst_case_tokens
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

CONTRACT = {
    "switchyard_requests": "counter",
    "switchyard_time_to_first_token_seconds": "histogram",
    "switchyard_inter_token_latency_seconds": "histogram",
    "switchyard_request_duration_seconds": "histogram",
    "switchyard_proxy_overhead_seconds": "histogram",
    "switchyard_classifier_decision_seconds": "histogram",
    "switchyard_cascade_escalations": "counter",
    "switchyard_routed_requests": "counter",
    "switchyard_request_ttfb_seconds": "histogram",
    "switchyard_request_ttlb_seconds": "histogram",
    "switchyard_breaker_state": "gauge",
    "switchyard_cost_usd": "counter",
    "switchyard_tokens": "counter",
    "switchyard_cache_tokens": "counter",
    "switchyard_budget_used_ratio": "gauge",
    "switchyard_queue_depth_tokens": "gauge",
    "switchyard_refusals": "counter",
}
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
ODD_NAME = 'we"ird\\model'


@pytest.fixture
def proxy():
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
        "broken": FakeState(behaviour=FakeBehaviour(failure="500")),
        # still streaming when its client leaves, however slow the machine
        "slow": FakeState(behaviour=FakeBehaviour(num_tokens=100_000, token_delay_s=0.02)),
    }
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}
        settings = Settings(
            models=[
                {
                    "name": "m-small",
                    "base_url": urls["small"],
                    "tier": "small",
                    "price": PRICE,
                    "capabilities": {"tools": False},
                },
                {"name": "m-large", "base_url": urls["large"], "tier": "large", "price": PRICE},
                {"name": "broken", "base_url": urls["broken"]},
                {"name": ODD_NAME, "base_url": urls["large"]},
                {"name": "slow", "base_url": urls["slow"]},
                {"name": "flaky", "base_url": urls["broken"], "fallbacks": ["m-large"]},
            ],
            routing={
                "auto": {
                    "tiers": ["small", "large"],
                    "thresholds": [0.45],
                    "warm_up": False,
                    "deadline_ms": 10_000,
                    "max_wait_ms": 1,
                }
            },
            cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
            resilience={"max_attempts": 1},
            upstream={"health_timeout_s": 30},  # a probe late on a busy machine must not take a tier out of the routes
            billing={"ledger_path": None},
        )
        # the score is read out of the prompt, so the route is known in advance
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        yield stack.enter_context(serve_in_thread(app))


def _chat(base: str, model: str, content: str = "hi", stream: bool = False, **headers) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=20)


def _families(base: str) -> dict:
    reply = httpx.get(base + "/metrics", timeout=30)
    assert reply.headers["content-type"] == CONTENT_TYPE_LATEST
    return {f.name: f for f in text_string_to_metric_families(reply.text)}


def _value(families: dict, sample_name: str, **labels: str) -> float:
    family = families[sample_name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")]
    return sum(
        s.value
        for s in family.samples
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_every_contract_family_is_listed_before_any_traffic(proxy):
    text = httpx.get(proxy + "/metrics").text
    families = _families(proxy)
    for name, kind in CONTRACT.items():
        assert families[name].type == kind, name
        exposed = name + "_total" if kind == "counter" else name
        assert f"# HELP {exposed} " in text and f"# TYPE {exposed} {kind}" in text
    assert _value(families, "switchyard_requests_total") == 0
    # the families /metrics had before prometheus-client, under the same sample names
    for name in ("switchyard_model_ready", "switchyard_in_flight", "switchyard_cascade_judged"):
        assert name in families
    assert "switchyard_shed_total" in text and "switchyard_attempts_total" in text
    assert _value(families, "switchyard_model_ready", model="m-large") in (0.0, 1.0)


def test_traffic_is_counted_once_per_request_with_its_route_and_status(proxy):
    assert _chat(proxy, "m-large").status_code == 200
    with httpx.stream(
        "POST",
        proxy + "/v1/chat/completions",
        json={"model": "m-large", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        timeout=20,
    ) as streamed:
        assert streamed.status_code == 200
        assert "[DONE]" in streamed.read().decode()
    high = _chat(proxy, "auto", "score=0.9")
    low = _chat(proxy, "auto", "score=0.2")
    climbed = _chat(proxy, "cascade")
    failed = _chat(proxy, "broken")
    assert [r.status_code for r in (high, low, climbed)] == [200, 200, 200]
    assert low.headers["x-switchyard-model"] == climbed.headers["x-switchyard-model"] == "m-large"
    assert failed.status_code >= 500

    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 6, timeout_s=30)
    families = _families(proxy)
    total = "switchyard_requests_total"
    assert _value(families, total, route="explicit") == 3
    assert _value(families, total, route="auto") == 2
    assert _value(families, total, route="cascade") == 1
    assert _value(families, total, model="m-large", backend="openai#0", tier="large", status="200") == 5
    assert _value(families, total, model="broken", status=str(failed.status_code)) == 1
    assert _value(families, "switchyard_request_duration_seconds_count") == 6
    # the auto request at 0.2 and the cascade's both started on m-small and were not sure enough
    escalations = _value(
        families,
        "switchyard_cascade_escalations_total",
        from_rung="m-small",
        to_rung="m-large",
        reason="low-confidence",
    )
    assert escalations == 2
    assert _value(families, "switchyard_classifier_decision_seconds_count") == 2
    assert _value(families, "switchyard_time_to_first_token_seconds_count", model="m-large") >= 1
    assert _value(families, "switchyard_inter_token_latency_seconds_count", model="m-large") >= 4
    assert _value(families, "switchyard_proxy_overhead_seconds_count") >= 1
    assert _value(families, "switchyard_tokens_total", team="", model="m-large", kind="completion") >= 5 * 5
    assert _value(families, "switchyard_tokens_total", model="m-small", kind="completion") >= 2
    assert _value(families, "switchyard_cost_usd_total", model="m-large") > 0


def test_route_decisions_fallbacks_and_hedges_are_counted_by_bounded_reasons(proxy):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for content in ("score=0.9", "score=0.2", "score=0.1"):
        assert _chat(proxy, "auto", content).status_code == 200
    body = {"model": "auto", "messages": [{"role": "user", "content": "score=0.2"}], "tools": tools}
    moved = httpx.post(proxy + "/v1/chat/completions", json=body, timeout=20)
    assert moved.status_code == 200 and "(small lacks tools)" in moved.headers["x-switchyard-route"]
    fell = _chat(proxy, "flaky")
    assert fell.status_code == 200 and fell.headers["x-switchyard-model"] == "m-large"

    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 5, timeout_s=30)
    families = _families(proxy)
    decisions = "switchyard_route_decisions_total"
    assert _value(families, decisions, tier="large", reason="score") == 1
    assert _value(families, decisions, tier="small", reason="score") == 2
    assert _value(families, decisions, tier="large", reason="capability") == 1
    assert _value(families, decisions) == 4
    assert _value(families, "switchyard_fallbacks_total", from_model="flaky", to_model="m-large") == 1
    assert _value(families, "switchyard_fallbacks_total") == 1  # an auto request's cascade climb is not one
    assert "switchyard_cascade_hedge_losses" in families and "switchyard_rate_limited" in families


def test_a_stream_the_client_leaves_is_counted_once_when_it_ends(proxy):
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", proxy + "/v1/chat/completions", json=body, timeout=20) as streamed:
        assert streamed.status_code == 200
        next(streamed.iter_lines())  # one event, then the client hangs up
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 1, timeout_s=30)
    families = _families(proxy)
    assert _value(families, "switchyard_requests_total", model="slow", route="explicit", status="200") == 1
    assert _value(families, "switchyard_attempts_total", model="slow", status="cancelled") == 1
    assert _value(families, "switchyard_request_duration_seconds_count", model="slow") == 1


def test_a_label_with_a_quote_and_a_backslash_is_escaped(proxy):
    assert _chat(proxy, ODD_NAME).status_code == 200
    text = httpx.get(proxy + "/metrics").text
    assert 'model="we\\"ird\\\\model"' in text
    families = _families(proxy)
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total", model=ODD_NAME) == 1, timeout_s=30)
    assert _value(families, "switchyard_breaker_state", model=ODD_NAME) == 0


def test_no_request_id_key_or_prompt_in_any_label(proxy):
    secret_prompt, request_id, key = "the-secret-prompt-text", "client-id-12345", "sk-never-a-label"
    _chat(proxy, "m-large", secret_prompt, **{"x-request-id": request_id, "authorization": f"Bearer {key}"})
    _chat(proxy, "no-such-model-" + secret_prompt)
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 2, timeout_s=30)
    for family in _families(proxy).values():
        for sample in family.samples:
            for value in sample.labels.values():
                assert secret_prompt not in value and request_id not in value and key not in value


def test_a_teams_cost_tokens_and_budget_share_are_by_team():
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        settings = Settings(
            models=[{"name": "m", "base_url": url, "price": {"input_usd_per_mtok": 1000, "output_usd_per_mtok": 1000}}],
            teams={"research": {"api_keys": ["sk-research"], "budget_usd_per_day": 1.0}},
            server={"metrics_public": True},  # scraped without a token
            billing={"ledger_path": None},
        )
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        assert _value(_families(base), "switchyard_budget_used_ratio", team="research") == 0
        reply = _chat(base, "m", authorization="Bearer sk-research")
        assert reply.status_code == 200
        cost = float(reply.headers["x-switchyard-cost-usd"])
        assert cost > 0
        ratio = "switchyard_budget_used_ratio"
        assert wait_until(lambda: _value(_families(base), ratio, team="research") > 0, timeout_s=30)
        families = _families(base)
        assert _value(families, "switchyard_budget_used_ratio", team="research") == pytest.approx(cost / 1.0)
        assert _value(families, "switchyard_cost_usd_total", team="research", model="m") == pytest.approx(cost)
        assert _value(families, "switchyard_tokens_total", team="research", model="m", kind="completion") == 5


# -- requests refused before the relay; TTFT of assembled answers; queue depth in tokens ----------


@pytest.fixture
def gated():
    """Keys, a small body limit, a priority tier with a max_tokens cap, and a team limited to 1 rpm."""
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        settings = Settings(
            models=[{"name": "m", "base_url": url, "tier": "small"}],
            teams={
                "capped": {"api_keys": ["sk-capped"], "priority": "short"},
                "once": {"api_keys": ["sk-once"], "rpm": 1},
            },
            server={"max_body_bytes": 1024, "metrics_public": True},
            billing={"ledger_path": None, "priority_tiers": {"short": {"max_tokens": 50}}},
        )
        yield stack.enter_context(serve_in_thread(create_app(settings)))


def _post(base: str, path: str, body: dict | bytes, key: str | None = "sk-capped") -> int:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    if isinstance(body, bytes):
        return httpx.post(base + path, content=body, headers=headers, timeout=20).status_code
    return httpx.post(base + path, json=body, headers=headers, timeout=20).status_code


def test_every_model_request_is_counted_once_whatever_refuses_it(gated):
    hi = [{"role": "user", "content": "hi"}]
    chat, total = "/v1/chat/completions", "switchyard_requests_total"
    # answered and refused inside the relay (it counts them itself)
    assert _post(gated, chat, {"model": "m", "messages": hi}) == 200
    assert _post(gated, chat, {"model": "m", "messages": hi}, key="sk-once") == 200
    assert _post(gated, chat, {"model": "m", "messages": hi}, key="sk-once") == 429  # rpm, before routing
    assert _post(gated, chat, {"model": "no-such-model-xyz", "messages": hi}) == 404
    assert _post(gated, "/v1/responses", {"model": "m", "input": "hi"}) == 200
    # refused before the relay
    assert _post(gated, chat, {"model": "m", "messages": hi}, key=None) == 401
    assert _post(gated, chat, {"model": "m", "messages": hi}, key="sk-wrong") == 401
    assert _post(gated, chat, b"{not json") == 400
    assert _post(gated, chat, {"model": "m"}) == 400  # no messages
    assert _post(gated, chat, {"model": "auto", "messages": "not a list"}) == 400
    assert _post(gated, chat, {"model": "secret-name-xyz", "messages": 3}) == 400
    assert _post(gated, chat, {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}) == 413
    assert _post(gated, chat, {"model": "m", "messages": hi, "max_tokens": 500}) == 400  # the tier's cap
    assert _post(gated, "/v1/completions/", {"model": "m", "prompt": 7}) == 400
    assert _post(gated, "/v1/responses", {"model": "m", "input": "hi", "background": True}) == 400
    assert httpx.get(gated + chat, headers={"authorization": "Bearer sk-capped"}).status_code == 405
    assert httpx.get(gated + "/v1/models", headers={"authorization": "Bearer sk-capped"}).status_code == 200

    assert wait_until(lambda: _value(_families(gated), total) == 16, timeout_s=30)
    families = _families(gated)
    assert _value(families, total, model="m", backend="openai#0", tier="small", status="200") == 3
    assert _value(families, total, model="m", backend="", tier="small", route="explicit", status="429") == 1
    assert _value(families, total, model="", backend="", tier="", route="explicit", status="404") == 1
    assert _value(families, total, model="", route="explicit", status="401") == 2  # the body was never read
    assert _value(families, total, model="m", backend="", tier="small", route="explicit", status="400") == 4
    assert _value(families, total, model="auto", backend="", tier="", route="auto", status="400") == 1
    assert _value(families, total, model="", route="explicit", status="400") == 2  # bad JSON, an unknown name
    assert _value(families, total, model="", status="413") == 1
    assert _value(families, total, model="", status="405") == 1
    assert _value(families, "switchyard_rate_limited_total", team="once", limit="requests") == 1
    assert _value(families, "switchyard_rate_limited_total") == 1
    assert not any(
        "secret-name" in value for s in families["switchyard_requests"].samples for value in s.labels.values()
    )
    # a refusal never called a model: no duration (only the three answers have one)
    assert _value(families, "switchyard_request_duration_seconds_count") == 3
    refusals = "switchyard_refusals_total"
    assert _value(families, refusals, team="once", reason="rate_limit") == 1
    assert _value(families, refusals, team="capped", reason="model_not_found") == 1
    assert _value(families, refusals, team="", reason="invalid_api_key") == 2
    assert _value(families, refusals, team="", reason="method_not_allowed") == 1  # answered before the key is read
    assert _value(families, refusals) == 16 - 3  # every request but the three answers


@pytest.fixture
def held():
    """One fake upstream that holds every answer until `release` is set, behind an assembling model
    (`held`, the default) and one asked whole (`held-plain`)."""
    release = threading.Event()
    state = FakeState(behaviour=FakeBehaviour(wait_for=release))
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        settings = Settings(
            models=[
                {"name": "held", "base_url": url},
                {"name": "held-plain", "base_url": url, "assemble_from_stream": False},
            ],
            billing={"ledger_path": None},
        )
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        yield base, state, release
        release.set()


def test_a_whole_answer_assembled_from_a_stream_has_a_time_to_first_token(held):
    base, _, release = held
    release.set()
    ttft = "switchyard_time_to_first_token_seconds_count"
    assert _value(_families(base), ttft, model="held") == 0
    assert _chat(base, "held").status_code == 200
    assert wait_until(lambda: _value(_families(base), ttft, model="held") == 1, timeout_s=30)
    assert _chat(base, "held-plain").status_code == 200  # answered whole: no first token to time
    total = "switchyard_requests_total"
    assert wait_until(lambda: _value(_families(base), total, model="held-plain") == 1, timeout_s=30)
    assert _value(_families(base), ttft, model="held-plain") == 0


def _sent(base: str, body: dict) -> socket.socket:
    """A connection on which a POST of `body` to /v1/chat/completions was sent (its answer unread)."""
    host, port = base.removeprefix("http://").split(":")
    payload = orjson.dumps(body)
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(payload)}\r\n\r\n"
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(head.encode() + payload)
    return sock


def test_queue_depth_counts_the_tokens_sent_that_have_no_first_token_yet(held):
    base, state, release = held
    depth = "switchyard_queue_depth_tokens"
    families = _families(base)
    assert _value(families, depth, model="held") == _value(families, depth, model="held-plain") == 0
    body = {"model": "held", "messages": [{"role": "user", "content": "a prompt of some length"}], "max_tokens": 100}
    wanted = worst_case_tokens(ChatCompletionRequest.from_payload(body))
    calls = [
        {**body, "stream": True},
        body,
        {**body, "model": "held-plain"},
    ]
    with ThreadPoolExecutor(len(calls)) as pool:
        replies = [pool.submit(httpx.post, base + "/v1/chat/completions", json=call, timeout=20) for call in calls]
        assert wait_until(lambda: state.num_requests == 3, timeout_s=30)
        families = _families(base)
        assert _value(families, depth, model="held") == 2 * wanted > 200
        assert _value(families, depth, model="held-plain") == wanted
        release.set()
        assert [reply.result().status_code for reply in replies] == [200, 200, 200]
        families = _families(base)
        assert _value(families, depth, model="held") == _value(families, depth, model="held-plain") == 0
    # an answer being assembled leaves the queue at its first chunk, not at its end: this one
    # stalls after its first chunk until the client gives up
    stalled = {**body, "fake": {"failure": "stall", "drop_after": 1}}
    with _sent(base, stalled) as client:
        assert wait_until(lambda: state.num_requests == 4, timeout_s=30)
        assert wait_until(lambda: _value(_families(base), depth, model="held") == 0, timeout_s=30)
        assert not select.select([client], [], [], 0)[0]  # not answered: the answer is still being assembled
    # the client gives up
