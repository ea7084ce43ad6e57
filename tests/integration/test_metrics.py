"""`/metrics` through the proxy: the contract's families before any traffic, then what explicit,
auto, cascade, streamed and failed requests leave in them, read back with prometheus_client's parser."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

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
    "switchyard_breaker_state": "gauge",
    "switchyard_cost_usd": "counter",
    "switchyard_tokens": "counter",
    "switchyard_budget_used_ratio": "gauge",
    "switchyard_queue_depth_tokens": "gauge",
}
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
ODD_NAME = 'we"ird\\model'


@pytest.fixture
def proxy():
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
        "broken": FakeState(behaviour=FakeBehaviour(failure="500")),
        "slow": FakeState(behaviour=FakeBehaviour(num_tokens=500, token_delay_s=0.02)),
    }
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}
        settings = Settings(
            models=[
                {"name": "m-small", "base_url": urls["small"], "tier": "small", "price": PRICE},
                {"name": "m-large", "base_url": urls["large"], "tier": "large", "price": PRICE},
                {"name": "broken", "base_url": urls["broken"]},
                {"name": ODD_NAME, "base_url": urls["large"]},
                {"name": "slow", "base_url": urls["slow"]},
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
            billing={"ledger_path": None},
        )
        # the score is read out of the prompt, so the route is known in advance
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        yield stack.enter_context(serve_in_thread(app))


def _chat(base: str, model: str, content: str = "hi", stream: bool = False, **headers) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream}
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=20)


def _families(base: str) -> dict:
    reply = httpx.get(base + "/metrics")
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

    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 6)
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


def test_a_stream_the_client_leaves_is_counted_once_when_it_ends(proxy):
    body = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", proxy + "/v1/chat/completions", json=body, timeout=20) as streamed:
        assert streamed.status_code == 200
        next(streamed.iter_lines())  # one event, then the client hangs up
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 1)
    families = _families(proxy)
    assert _value(families, "switchyard_requests_total", model="slow", route="explicit", status="200") == 1
    assert _value(families, "switchyard_attempts_total", model="slow", status="cancelled") == 1
    assert _value(families, "switchyard_request_duration_seconds_count", model="slow") == 1


def test_a_label_with_a_quote_and_a_backslash_is_escaped(proxy):
    assert _chat(proxy, ODD_NAME).status_code == 200
    text = httpx.get(proxy + "/metrics").text
    assert 'model="we\\"ird\\\\model"' in text
    families = _families(proxy)
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total", model=ODD_NAME) == 1)
    assert _value(families, "switchyard_breaker_state", model=ODD_NAME) == 0


def test_no_request_id_key_or_prompt_in_any_label(proxy):
    secret_prompt, request_id, key = "the-secret-prompt-text", "client-id-12345", "sk-never-a-label"
    _chat(proxy, "m-large", secret_prompt, **{"x-request-id": request_id, "authorization": f"Bearer {key}"})
    _chat(proxy, "no-such-model-" + secret_prompt)
    assert wait_until(lambda: _value(_families(proxy), "switchyard_requests_total") == 2)
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
            billing={"ledger_path": None},
        )
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        assert _value(_families(base), "switchyard_budget_used_ratio", team="research") == 0
        reply = _chat(base, "m", authorization="Bearer sk-research")
        assert reply.status_code == 200
        cost = float(reply.headers["x-switchyard-cost-usd"])
        assert cost > 0
        assert wait_until(lambda: _value(_families(base), "switchyard_budget_used_ratio", team="research") > 0)
        families = _families(base)
        assert _value(families, "switchyard_budget_used_ratio", team="research") == pytest.approx(cost / 1.0)
        assert _value(families, "switchyard_cost_usd_total", team="research", model="m") == pytest.approx(cost)
        assert _value(families, "switchyard_tokens_total", team="research", model="m", kind="completion") == 5
