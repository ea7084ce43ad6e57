"""The cascade through the proxy, against two fake upstreams with scripted logprobs.

`cheap` answers "alpha bravo …", `strong` answers "strong1 strong2 …", so the text a client
receives says which rung answered. Confidence is `mean_logprob` against -0.5.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import ExitStack

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchyard.backends.defaults import load_settings
from switchyard.core.settings import ConfigError, Settings
from switchyard.proxy.app import create_app
from tests.fakes.clock import ManualClock
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_for_records, wait_until

HI = [{"role": "user", "content": "What is the capital of France?"}]
TIMEOUT_S = 30  # bounds a hang only: every request below that is meant to answer does so far sooner
ENDLESS = 100_000  # tokens: a stream that outlasts any test
STRONG_WORDS = ("strong1", "strong2", "strong3", "strong4", "strong5", "strong6")
SURE, UNSURE = [-0.01], [-2.0]


def _text(words: tuple[str, ...], n: int) -> str:
    return "".join(words[i % len(words)] + " " for i in range(n))


CHEAP_TEXT = _text(("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"), 5)
STRONG_TEXT = _text(STRONG_WORDS, 5)


@pytest.fixture
def ladder(tmp_path):
    states = {"cheap": FakeState(), "strong": FakeState(behaviour=FakeBehaviour(words=STRONG_WORDS))}
    with ExitStack() as stack:
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}

        def proxy(teams=None, **cascade) -> tuple[str, object]:
            settings = Settings(
                models=[
                    {
                        "name": "cheap",
                        "base_url": urls["cheap"],
                        "price": {"input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.2},
                    },
                    {
                        "name": "strong",
                        "base_url": urls["strong"],
                        "price": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
                    },
                ],
                cascade={
                    "ladder": ["cheap", "strong"],
                    "scorer": "mean_logprob",
                    "threshold": -0.5,
                    "stream_tokens": 4,
                    "stream_budget_ms": 5000,
                    **cascade,
                },
                resilience={"max_attempts": 1},
                billing={"ledger_path": tmp_path / f"usage-{len(states)}-{time.monotonic_ns()}.db"},
                teams=teams or {},
                server={"metrics_public": True},  # scraped without a token
            )
            app = create_app(settings)
            return stack.enter_context(serve_in_thread(app)), app

        yield states, proxy


def _post(base: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=TIMEOUT_S)


def _stream(base: str, body: dict, headers: dict | None = None) -> tuple[httpx.Headers, str, list[dict]]:
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={**body, "stream": True}, headers=headers or {}, timeout=TIMEOUT_S
    ) as response:
        assert response.status_code == 200, response.read()
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    return response.headers, text, chunks


def _records(app, request_id: str, count: int, *, by_client_id: bool = False):
    key = "client_request_id" if by_client_id else "request_id"
    wait_for_records(app, count, timeout_s=TIMEOUT_S, **{key: request_id})
    # and no more than `count`: once no request is in flight, every attempt has been metered; once the
    # ledger's writer has nothing pending nor a batch in hand, all of it is written
    ledger = app.state.services.ledger
    assert wait_until(
        lambda: not app.state.in_flight.tasks and not ledger.status().pending and not ledger._lock.locked(),
        timeout_s=TIMEOUT_S,
    )
    return read_ledger(app, **{key: request_id})


# -- non-stream --------------------------------------------------------------------------------


def test_a_confident_cheap_answer_is_the_answer(ladder):
    states, proxy = ladder
    base, app = proxy()
    states["cheap"].behaviour.logprobs = SURE
    response = _post(base, {"model": "cascade", "messages": HI})
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == CHEAP_TEXT
    assert body["choices"][0]["logprobs"] is None  # asked for by the cascade, not by the client
    assert response.headers["x-switchyard-model"] == "cheap"
    assert response.headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50)"
    assert states["strong"].num_requests == 0
    sent = states["cheap"].records[0].body
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5
    [record] = _records(app, response.headers["x-request-id"], 1)
    assert (record.model, record.status) == ("cheap", "completed")


def test_an_unconfident_cheap_answer_escalates_and_both_attempts_are_metered(ladder):
    states, proxy = ladder
    base, app = proxy()
    states["cheap"].behaviour.logprobs = UNSURE
    response = _post(base, {"model": "cascade", "messages": HI})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == STRONG_TEXT
    assert response.headers["x-switchyard-model"] == "strong"
    assert response.headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->strong"
    assert "logprobs" not in states["strong"].records[0].body  # the last rung is never judged
    cheap, strong = _records(app, response.headers["x-request-id"], 2)
    assert (cheap.attempt, cheap.model, cheap.status) == (1, "cheap", "escalated")
    assert (strong.attempt, strong.model, strong.status) == (2, "strong", "completed")
    assert cheap.completion_tokens == 5 and not cheap.is_estimated
    assert cheap.cost_usd > 0 and strong.cost_usd > cheap.cost_usd


@pytest.mark.parametrize("stream", [False, True])
def test_the_cascade_reserves_before_it_climbs_and_answers_with_what_it_has_when_the_budget_is_short(ladder, stream):
    """The first rung's worst case ($1.8e-6) fits a $1e-5 budget; the strong rung's ($1.8e-5) does not."""
    states, proxy = ladder
    team = f"frugal-{uuid.uuid4().hex[:8]}"  # its own name: the session's ledger is shared
    base, app = proxy(teams={team: {"api_keys": [f"sk-{team}"], "budget_usd_per_day": 1e-5}})
    states["cheap"].behaviour.logprobs = UNSURE
    body = {"model": "cascade", "messages": HI, "max_tokens": 5}
    auth = {"authorization": f"Bearer sk-{team}"}
    if stream:
        headers, text, _ = _stream(base, body, auth)
    else:
        response = _post(base, body, auth)
        assert response.status_code == 200, response.text
        headers, text = response.headers, response.json()["choices"][0]["message"]["content"]
    assert text == CHEAP_TEXT
    assert headers["x-switchyard-model"] == "cheap"
    assert headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->over-budget"
    assert states["strong"].num_requests == 0
    [record] = _records(app, headers["x-request-id"], 1)
    assert (record.model, record.status, record.team) == ("cheap", "completed", team)


def test_a_failed_rung_whose_next_rung_the_budget_cannot_hold_is_refused_with_the_budgets_reason(ladder):
    """The cheap rung fails; the strong rung's worst case ($1.8e-5) is more than the whole day's
    budget ($1e-5): retrying cannot help, and the refusal says so (no Retry-After)."""
    states, proxy = ladder
    team = f"frugal-{uuid.uuid4().hex[:8]}"
    base, app = proxy(teams={team: {"api_keys": [f"sk-{team}"], "budget_usd_per_day": 1e-5}})
    states["cheap"].behaviour.failure = "500"
    response = _post(
        base, {"model": "cascade", "messages": HI, "max_tokens": 5}, {"authorization": f"Bearer sk-{team}"}
    )
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert error["message"].startswith(
        "The cascade's cheap failed, and what is left of the budget does not cover strong: "
    )
    assert "it can never fit" in error["message"]
    assert "retry-after" not in response.headers and response.headers["x-should-retry"] == "false"
    assert states["strong"].num_requests == 0


def test_logprobs_the_client_asked_for_are_kept_as_many_as_it_asked(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.logprobs = SURE
    with openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0) as sdk:
        answer = sdk.chat.completions.create(model="cascade", messages=HI, logprobs=True, top_logprobs=2)
    entries = answer.choices[0].logprobs.content
    assert len(entries) == 5 and all(len(e.top_logprobs) == 2 for e in entries)
    assert states["cheap"].records[0].body["top_logprobs"] == 5


def test_a_team_climbs_only_as_far_as_its_models_reach(ladder):
    states, proxy = ladder
    base, _ = proxy(teams={"frugal": {"api_keys": ["sk-f"], "models": ["cheap"]}, "all": {"api_keys": ["sk-a"]}})
    states["cheap"].behaviour.logprobs = UNSURE
    frugal = _post(base, {"model": "cascade", "messages": HI}, {"authorization": "Bearer sk-f"})
    everyone = _post(base, {"model": "cascade", "messages": HI}, {"authorization": "Bearer sk-a"})
    assert frugal.status_code == 200 and frugal.json()["choices"][0]["message"]["content"] == CHEAP_TEXT
    assert frugal.headers["x-switchyard-model"] == "cheap"
    assert "logprobs" not in states["cheap"].records[0].body  # its last reachable rung: never judged
    assert everyone.headers["x-switchyard-model"] == "strong"
    assert states["strong"].num_requests == 1


def test_a_failing_cheap_rung_escalates(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.failure = "500"
    response = _post(base, {"model": "cascade", "messages": HI})
    assert response.status_code == 200
    assert response.headers["x-switchyard-cascade"] == "cheap(error)->strong"


def test_a_request_the_cheap_rung_refuses_is_not_escalated(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.failure = "400"
    response = _post(base, {"model": "cascade", "messages": HI})
    assert response.status_code == 400
    assert states["strong"].num_requests == 0


def test_opting_out_answers_with_the_first_rung_unjudged(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.logprobs = UNSURE
    response = _post(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "off"})
    assert response.json()["choices"][0]["message"]["content"] == CHEAP_TEXT
    assert response.headers["x-switchyard-cascade"] == "off"
    assert "logprobs" not in states["cheap"].records[0].body
    assert states["strong"].num_requests == 0


def test_a_bad_cascade_header_is_a_clear_400(ladder):
    _, proxy = ladder
    base, _ = proxy()
    response = _post(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "sometimes"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "x-switchyard-cascade" and "on, off, hedge" in error["message"]


def test_explicit_model_names_bypass_the_cascade(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.logprobs = UNSURE
    response = _post(base, {"model": "cheap", "messages": HI})
    assert response.headers["x-switchyard-model"] == "cheap"
    assert "x-switchyard-cascade" not in response.headers
    assert states["strong"].num_requests == 0


# -- stream ------------------------------------------------------------------------------------


def test_a_confident_stream_is_the_cheap_rungs_stream(ladder):
    states, proxy = ladder
    base, app = proxy()
    states["cheap"].behaviour = FakeBehaviour(num_tokens=12, logprobs=SURE)
    headers, text, chunks = _stream(base, {"model": "cascade", "messages": HI})
    assert text == _text(FakeBehaviour().words, 12)
    assert headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50)"
    assert all(c["choices"][0].get("logprobs") is None for c in chunks if c.get("choices"))
    assert states["strong"].num_requests == 0
    [record] = _records(app, headers["x-request-id"], 1)
    assert (record.status, record.completion_tokens) == ("completed", 12)


def test_an_unconfident_stream_is_cancelled_and_the_client_sees_only_the_strong_stream(ladder):
    states, proxy = ladder
    base, app = proxy()
    states["cheap"].behaviour = FakeBehaviour(num_tokens=ENDLESS, token_delay_s=0.01, logprobs=UNSURE)
    headers, text, chunks = _stream(base, {"model": "cascade", "messages": HI})
    assert text == STRONG_TEXT  # exactly one rung's output, from its start
    assert {c["id"] for c in chunks} == {"chunk-fake"} and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert headers["x-switchyard-model"] == "strong"
    assert headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->strong"
    cheap = states["cheap"].records[0]
    assert wait_until(lambda: cheap.disconnected_at is not None, TIMEOUT_S)  # really cancelled upstream
    escalated, answered = _records(app, headers["x-request-id"], 2)
    assert (escalated.model, escalated.status, escalated.completion_tokens) == ("cheap", "escalated", 4)
    assert escalated.is_estimated and escalated.prompt_tokens > 0
    assert (answered.model, answered.status, answered.completion_tokens) == ("strong", "completed", 5)


def test_a_stream_is_judged_at_its_time_budget_when_tokens_are_slow(ladder):
    states, proxy = ladder
    base, _ = proxy(stream_budget_ms=150, stream_tokens=16)
    states["cheap"].behaviour = FakeBehaviour(num_tokens=8, token_delay_s=0.1, logprobs=SURE)
    headers, text, _ = _stream(base, {"model": "cascade", "messages": HI})
    assert headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50)"
    assert text == _text(FakeBehaviour().words, 8)  # the held-back tokens and the rest, in order


def test_a_short_answer_is_judged_whole(ladder):
    states, proxy = ladder
    base, _ = proxy(stream_tokens=64)
    states["cheap"].behaviour = FakeBehaviour(num_tokens=2, logprobs=SURE)
    headers, text, _ = _stream(base, {"model": "cascade", "messages": HI, "stream_options": {"include_usage": True}})
    assert text == "alpha bravo "
    assert headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50)"


def test_the_openai_sdk_streams_through_an_escalation(ladder):
    states, proxy = ladder
    base, _ = proxy()
    states["cheap"].behaviour.logprobs = UNSURE
    with openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0) as sdk:
        stream = sdk.chat.completions.create(model="cascade", messages=HI, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == STRONG_TEXT


def test_a_client_that_leaves_during_the_decision_cancels_and_meters_the_cheap_stream(ladder):
    states, proxy = ladder
    # the verdict would wait for 64 tokens a second apart (or two minutes): far beyond this test
    base, app = proxy(stream_tokens=64, stream_budget_ms=120_000)
    states["cheap"].behaviour = FakeBehaviour(num_tokens=1000, token_delay_s=1.0, logprobs=SURE)
    waiting = app.state.services.executor.waiting  # tokens sent to a model that has no first token yet

    async def leave_once_the_first_token_is_in() -> None:
        body = {"model": "cascade", "messages": HI, "stream": True}
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            request = asyncio.create_task(
                client.post(base + "/v1/chat/completions", json=body, headers={"x-request-id": "req-client-left"})
            )
            first_token_in = lambda: states["cheap"].num_requests == 1 and waiting.of("cheap") == 0  # noqa: E731
            assert await asyncio.to_thread(wait_until, first_token_in, TIMEOUT_S)
            assert not request.done()  # no byte comes before the verdict: the client gives up
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request

    asyncio.run(leave_once_the_first_token_is_in())
    cheap = states["cheap"].records[0]
    # cancelled upstream, long before the 64 tokens the verdict would have waited for
    assert wait_until(lambda: cheap.disconnected_at is not None, timeout_s=TIMEOUT_S)
    [record] = _records(app, "req-client-left", 1, by_client_id=True)
    assert (record.model, record.status) == ("cheap", "cancelled") and record.completion_tokens >= 1
    assert states["strong"].num_requests == 0


# -- hedging -----------------------------------------------------------------------------------


def test_hedging_cancels_the_strong_rung_when_the_cheap_one_is_confident(ladder):
    states, proxy = ladder
    base, app = proxy()
    # the cheap rung answers once the hedge is upstream; the strong one never does
    states["cheap"].behaviour = FakeBehaviour(logprobs=SURE, wait_for=states["strong"].arrived)
    states["strong"].behaviour = FakeBehaviour(words=STRONG_WORDS, failure="hang")
    response = _post(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "hedge"})
    assert response.json()["choices"][0]["message"]["content"] == CHEAP_TEXT
    assert response.headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50);hedged"
    [strong] = states["strong"].records  # it was started in parallel …
    assert wait_until(lambda: strong.disconnected_at is not None, TIMEOUT_S)  # … and cancelled
    assert _hedge_counts(base) == {("wins", "cheap"): 1, ("losses", "strong"): 1}
    records = _records(app, response.headers["x-request-id"], 2)
    assert sorted((r.model, r.status) for r in records) == [("cheap", "completed"), ("strong", "cancelled")]
    assert sorted(r.attempt for r in records) == [1, 2]


def test_hedging_lets_a_faster_strong_rung_win(ladder):
    states, proxy = ladder
    base, app = proxy()
    # the cheap rung never answers; the strong one answers once the cheap one is upstream
    states["cheap"].behaviour = FakeBehaviour(logprobs=SURE, failure="hang")
    states["strong"].behaviour = FakeBehaviour(words=STRONG_WORDS, wait_for=states["cheap"].arrived)
    response = _post(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "hedge"})
    assert response.json()["choices"][0]["message"]["content"] == STRONG_TEXT
    assert response.headers["x-switchyard-cascade"] == "cheap(hedge-lost)->strong;hedged"
    [cheap] = states["cheap"].records
    assert wait_until(lambda: cheap.disconnected_at is not None, TIMEOUT_S)
    records = _records(app, response.headers["x-request-id"], 2)
    assert sorted((r.model, r.status) for r in records) == [("cheap", "cancelled"), ("strong", "completed")]
    assert _hedge_counts(base) == {("wins", "strong"): 1, ("losses", "cheap"): 1}


def _hedge_counts(base: str) -> dict[tuple[str, str], float]:
    """(wins|losses, model) -> count, from /metrics (zero counts left out)."""
    counts = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for kind in ("wins", "losses"):
            if family.name == f"switchyard_cascade_hedge_{kind}":
                counts |= {
                    (kind, s.labels["model"]): s.value for s in family.samples if s.value and s.name.endswith("_total")
                }
    return counts


def test_a_hedged_stream_cancels_the_loser(ladder):
    states, proxy = ladder
    base, app = proxy()
    states["cheap"].behaviour = FakeBehaviour(logprobs=UNSURE)
    states["strong"].behaviour = FakeBehaviour(words=STRONG_WORDS, token_delay_s=0.01)
    headers, text, _ = _stream(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "hedge"})
    assert text == STRONG_TEXT
    assert headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->strong;hedged"
    # the cheap rung answers once the hedge is under way upstream, which streams on until it loses
    states["strong"].arrived.clear()
    states["cheap"].behaviour = FakeBehaviour(logprobs=SURE, wait_for=states["strong"].arrived)
    states["strong"].behaviour = FakeBehaviour(words=STRONG_WORDS, num_tokens=ENDLESS, token_delay_s=0.01)
    headers, text, _ = _stream(base, {"model": "cascade", "messages": HI}, {"x-switchyard-cascade": "hedge"})
    assert text == CHEAP_TEXT
    assert states["strong"].num_requests == 2
    strong = states["strong"].records[-1]
    assert wait_until(lambda: strong.disconnected_at is not None, TIMEOUT_S)
    records = _records(app, headers["x-request-id"], 2)
    assert sorted((r.model, r.status) for r in records) == [("cheap", "completed"), ("strong", "cancelled")]


# -- thrash guard ------------------------------------------------------------------------------


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=TIMEOUT_S).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_the_thrash_guard_trips_and_recovers(ladder):
    states, proxy = ladder
    base, app = proxy(thrash={"window": 4, "min_requests": 4, "limit": 0.6, "cool_off_s": 2.0})
    clock = app.state.services.cascade.guard.clock = ManualClock()  # the cool-off passes when the test says
    states["cheap"].behaviour.logprobs = UNSURE
    for _ in range(4):
        assert _post(base, {"model": "cascade", "messages": HI}).headers["x-switchyard-cascade"].endswith("->strong")
    assert states["cheap"].num_requests == 4
    tripped = _post(base, {"model": "cascade", "messages": HI})
    assert tripped.headers["x-switchyard-cascade"] == "cheap(skipped:thrash-guard)->strong"
    assert states["cheap"].num_requests == 4  # the cheap rung was not tried
    assert _metric(base, 'switchyard_cascade_thrash_trips_total{route="cheap"}') == 1
    assert _metric(base, 'switchyard_cascade_thrash_active{route="cheap"}') == 1
    clock.advance(2.0)  # cool_off_s
    states["cheap"].behaviour.logprobs = SURE
    recovered = _post(base, {"model": "cascade", "messages": HI})
    assert recovered.headers["x-switchyard-cascade"] == "cheap(-0.01>=-0.50)"
    assert _metric(base, 'switchyard_cascade_thrash_active{route="cheap"}') == 0
    assert _metric(base, 'switchyard_cascade_judged_total{model="cheap",verdict="escalated"}') == 4


# -- configuration -----------------------------------------------------------------------------


def test_a_rung_without_logprobs_can_only_be_last(tmp_path):
    config = tmp_path / "switchyard.yaml"
    config.write_text(
        "models:\n"
        "  - {name: claude, backend: litellm, litellm_model: anthropic/claude-3-5-haiku-20241022}\n"
        "  - {name: local, base_url: 'http://127.0.0.1:1/v1'}\n"
        "cascade: {ladder: [claude, local]}\n"
    )
    with pytest.raises(ConfigError, match="'claude' returns no token logprobs"):
        load_settings(config)
    config.write_text(config.read_text().replace("[claude, local]", "[local, claude]"))
    assert load_settings(config).cascade.ladder == ["local", "claude"]


def test_model_cascade_without_a_ladder_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="cascade.ladder"):
        client.chat.completions.create(model="cascade", messages=HI)


# -- a commercial last rung ---------------------------------------------------------------------


def test_the_cascade_escalates_to_a_commercial_rung_through_litellm():
    """cheap (OpenAI-compatible, logprobs) -> claude (LiteLLM -> a fake Anthropic server, no logprobs)."""
    from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream

    cheap, anthropic = FakeState(behaviour=FakeBehaviour(logprobs=UNSURE)), AnthropicState()
    with ExitStack() as stack:
        cheap_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(cheap))) + "/v1"
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(anthropic)))
        settings = Settings(
            models=[
                {"name": "cheap", "base_url": cheap_url},
                {
                    "name": "claude",
                    "backend": "litellm",
                    "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                    "base_url": anthropic_url,
                    "api_key": "sk-ant-test",
                },
            ],
            cascade={"ladder": ["cheap", "claude"], "scorer": "mean_logprob", "threshold": -0.5, "stream_tokens": 3},
            resilience={"max_attempts": 1},
            billing={"ledger_path": None},
        )
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        with openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0) as sdk:
            raw = sdk.chat.completions.with_raw_response.create(model="cascade", messages=HI, max_tokens=50)
            assert raw.parse().choices[0].message.content == "bonjour from claude "
            assert raw.headers["x-switchyard-cascade"] == "cheap(-2.00<-0.50)->claude"
            with sdk.chat.completions.with_streaming_response.create(
                model="cascade", messages=HI, max_tokens=50, stream=True
            ) as response:
                assert response.headers["x-switchyard-model"] == "claude"
                text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text == "bonjour from claude "
    assert cheap.num_requests == 2
