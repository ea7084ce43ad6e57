"""OpenTelemetry traces: one span per request, children for classify, cascade rungs and backend
attempts; `traceparent` sent upstream; a client's trace continued; nothing when tracing is off."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from switchyard.core.settings import Settings, TracingSettings
from switchyard.core.tracing import build_tracing
from switchyard.proxy.app import create_app
from switchyard.proxy.middleware.tracing import RequestTracingMiddleware
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

TIMEOUT_S = 30  # bounds a hang only
TEAM_KEY = "sk-team-alpha-7f3e9c21d4"
UPSTREAM_KEY = "sk-upstream-b81d55e0aa"
PROMPT = "tell me a private thing, score="
REQUEST_SPAN = "POST /v1/chat/completions"
CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


def _proxy(stack: ExitStack, exporter: InMemorySpanExporter | None):
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
    settings = Settings(
        models=[
            {"name": f"m-{tier}", "base_url": url, "tier": tier, "api_key": UPSTREAM_KEY} for tier, url in urls.items()
        ],
        routing={"auto": {"tiers": ["small", "large"], "thresholds": [0.45], "warm_up": False, "deadline_ms": 10_000}},
        cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
        teams={"alpha": {"api_keys": [TEAM_KEY]}},
        billing={"ledger_path": None},
    )
    # the score is read out of the prompt, so the route is known in advance
    app = create_app(
        settings,
        score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]),
        span_exporter=exporter,
    )
    return stack.enter_context(serve_in_thread(app)), states, app


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    with ExitStack() as stack:
        url, states, _ = _proxy(stack, exporter)
        yield url, states, exporter


def _ask(url: str, score: float, *, stream: bool = False, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"{PROMPT}{score}"}], "stream": stream}
    headers = {"authorization": f"Bearer {TEAM_KEY}", **(headers or {})}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=TIMEOUT_S)


def _request_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The request spans once `count` have ended (a request's span ends just after its last byte)."""

    def spans() -> list[ReadableSpan]:
        return [s for s in exporter.get_finished_spans() if s.name == REQUEST_SPAN]

    assert wait_until(lambda: len(spans()) >= count, timeout_s=TIMEOUT_S), f"{count} request span(s) expected"
    return spans()


def _children(spans: list[ReadableSpan], parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and s.parent is not None and s.parent.span_id == parent.context.span_id]


@pytest.mark.parametrize("stream", [False, True])
def test_an_escalating_cascade_request_is_one_trace(traced, stream):
    url, states, exporter = traced
    answer = _ask(url, 0.2, stream=stream)
    assert answer.status_code == 200
    assert answer.headers["x-switchyard-cascade"] == "m-small(-3.00<-1.00)->m-large"
    (request,) = _request_spans(exporter, 1)
    spans = exporter.get_finished_spans()
    assert request.parent is None
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}
    attributes = request.attributes
    assert attributes["switchyard.request_id"] == answer.headers["x-request-id"]
    assert attributes["switchyard.team"] == "alpha"
    assert attributes["switchyard.requested_model"] == "auto"
    assert attributes["switchyard.model"] == "m-large"
    assert attributes["switchyard.route"] == "auto:classifier=0.200<0.450->small"
    assert attributes["http.response.status_code"] == 200

    (classify,) = _children(spans, request, "classify")
    assert classify.attributes["switchyard.score"] == pytest.approx(0.2)
    rungs = {s.attributes["switchyard.rung"]: s for s in _children(spans, request, "cascade rung")}
    assert set(rungs) == {"m-small", "m-large"}
    for model, rung in rungs.items():
        (attempt,) = _children(spans, rung, "backend attempt")
        assert attempt.attributes["switchyard.model"] == model
        # the upstream's request carries the attempt's span as its parent, in the request's trace
        (record,) = states[model.removeprefix("m-")].records
        version, trace_id, parent_id, flags = record.headers["traceparent"].split("-")
        assert version == "00" and int(flags, 16) & 1  # sampled
        assert int(trace_id, 16) == request.context.trace_id
        assert int(parent_id, 16) == attempt.context.span_id


def test_no_attribute_carries_the_prompt_or_a_key(traced):
    url, _, exporter = traced
    assert _ask(url, 0.2).status_code == 200
    assert _ask(url, 0.9, stream=True).status_code == 200
    _request_spans(exporter, 2)
    for span in exporter.get_finished_spans():
        for value in [span.name, *map(str, span.attributes.values())]:
            assert PROMPT not in value and TEAM_KEY not in value and UPSTREAM_KEY not in value


def test_a_client_traceparent_is_continued(traced):
    url, states, exporter = traced
    traceparent = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
    assert _ask(url, 0.9, headers={"traceparent": traceparent}).status_code == 200
    (request,) = _request_spans(exporter, 1)
    assert request.context.trace_id == int(CLIENT_TRACE_ID, 16)
    assert request.parent is not None and request.parent.span_id == int(CLIENT_SPAN_ID, 16)
    (record,) = states["large"].records
    assert record.headers["traceparent"].split("-")[1] == CLIENT_TRACE_ID


def test_a_malformed_traceparent_starts_a_new_trace(traced):
    url, _, exporter = traced
    assert _ask(url, 0.9, headers={"traceparent": "00-not-a-trace-01"}).status_code == 200
    (request,) = _request_spans(exporter, 1)
    assert request.parent is None


def test_with_tracing_off_nothing_is_traced_or_sent():
    assert build_tracing(TracingSettings()) is None  # no endpoint: no provider at all
    with ExitStack() as stack:
        url, states, app = _proxy(stack, None)
        assert RequestTracingMiddleware not in [middleware.cls for middleware in app.user_middleware]
        traceparent = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
        assert _ask(url, 0.2, headers={"traceparent": traceparent}).status_code == 200
        assert _ask(url, 0.2, stream=True).status_code == 200
        for state in states.values():
            assert state.records
            assert all("traceparent" not in record.headers for record in state.records)


def test_an_endpoint_turns_tracing_on():
    tracing = build_tracing(TracingSettings(otlp_endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.5))
    assert tracing is not None
    assert tracing.provider.resource.attributes["service.name"] == "switchyard"
    tracing.shutdown()


@pytest.mark.slow  # importing LiteLLM takes seconds
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_litellm_sends_the_traceparent(provider):
    exporter = InMemorySpanExporter()
    openai_state, anthropic_state = FakeState(), AnthropicState()
    with ExitStack() as stack:
        if provider == "openai":
            base_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(openai_state))) + "/v1"
            litellm_model = "openai/gpt-4o"
        else:
            base_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(anthropic_state)))
            litellm_model = "anthropic/claude-3-5-sonnet-20241022"
        model = {"name": "m", "backend": "litellm", "litellm_model": litellm_model, "base_url": base_url}
        settings = Settings(models=[{**model, "api_key": UPSTREAM_KEY}], billing={"ledger_path": None})
        url = stack.enter_context(serve_in_thread(create_app(settings, span_exporter=exporter)))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S).status_code == 200
    (request,) = _request_spans(exporter, 1)
    sent = openai_state.records[-1].headers if provider == "openai" else anthropic_state.headers[-1]
    assert int(sent["traceparent"].split("-")[1], 16) == request.context.trace_id
