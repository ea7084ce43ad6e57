"""Breakers that measure health: per replica, 429 cooldowns, failures after the first streamed byte."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.clock import freeze_breakers
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

HI = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30  # bounds a hang only: every request below that is meant to answer does so far sooner
ENDLESS = 100_000  # tokens: a stream that outlasts any test


@pytest.fixture
def fakes():
    """Start fake upstreams by name (`fakes(name, ...)` → its base url) and proxies over them;
    `fakes.clock`: the breakers' clock of the last proxy, which moves only when the test advances it."""
    with ExitStack() as stack:
        states: dict[str, FakeState] = {}

        def upstream(name: str, behaviour: FakeBehaviour | None = None) -> str:
            states[name] = FakeState(behaviour=behaviour or FakeBehaviour(words=(name,)))
            return stack.enter_context(serve_in_thread(FakeOpenAIUpstream(states[name]))) + "/v1"

        def proxy(models: list[dict], resilience: dict) -> str:
            settings = Settings(models=models, resilience=resilience, upstream={"read_timeout_s": TIMEOUT_S})
            app = create_app(settings)
            base = stack.enter_context(serve_in_thread(app))
            upstream.clock = freeze_breakers(app)
            return base

        upstream.states, upstream.proxy = states, proxy
        yield upstream


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT_S)


def _ready(base: str) -> dict:
    return httpx.get(base + "/health/ready", timeout=TIMEOUT_S).json()


def _primary_with_fallback(fakes, resilience: dict, *, fallbacks: bool = True) -> str:
    models = [
        {"name": "primary", "base_url": fakes("a"), "fallbacks": ["secondary"] if fallbacks else []},
        {"name": "secondary", "base_url": fakes("b")},
    ]
    return fakes.proxy(models, resilience)


# -- per replica --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failing_replica_is_taken_out_while_the_other_serves(fakes):
    bad = fakes("bad", FakeBehaviour(failure="500"))
    good = fakes("good")
    base = fakes.proxy(
        [{"name": "pair", "replicas": [{"base_url": bad}, {"base_url": good}]}],
        {"max_attempts": 2, "backoff_base_s": 0, "breaker_fail_max": 3, "breaker_reset_s": 5},
    )  # the reset passes only when the test advances the breakers' clock
    with _sdk(base) as sdk:
        replies = [sdk.chat.completions.with_raw_response.create(model="pair", messages=HI) for _ in range(8)]
        assert {r.status_code for r in replies} == {200}  # never a circuit_open, nor a 502
        assert fakes.states["bad"].num_requests == 3  # breaker_fail_max, then no more
        assert fakes.states["good"].num_requests == 8
        ready = _ready(base)
        assert ready["breakers"]["pair"] == "closed"  # one bad replica of two does not open the model
        assert ready["replicas"] == {"pair": {"openai#0": "open", "openai#1": "closed"}}
        assert "127.0.0.1" not in str(ready["replicas"])
        metrics = httpx.get(base + "/metrics").text
        assert 'switchyard_replica_breaker_state{model="pair",replica="openai#0"} 2' in metrics

        # past breaker_reset_s: half-open, one trial may go to the bad replica
        fakes.clock.advance(5)
        assert _ready(base)["replicas"]["pair"]["openai#0"] == "half-open"
        replies = [sdk.chat.completions.with_raw_response.create(model="pair", messages=HI) for _ in range(4)]
    assert {r.status_code for r in replies} == {200}
    assert fakes.states["bad"].num_requests == 3 + 1  # exactly one trial; it failed, so open again
    assert _ready(base)["replicas"]["pair"]["openai#0"] == "open"


@pytest.mark.parametrize("failure", ["drop", "hang"])
def test_a_replica_whose_streams_break_or_hang_is_taken_out(fakes, failure):
    bad = fakes("bad", FakeBehaviour(failure=failure, drop_after=2))
    good = fakes("good")
    # the good replica's first token must beat the same timeout the hung one runs into: room for a busy machine
    base = fakes.proxy(
        [{"name": "pair", "replicas": [{"base_url": bad}, {"base_url": good}]}],
        {"max_attempts": 2, "backoff_base_s": 0, "first_token_timeout_s": 2, "breaker_fail_max": 2},
    )
    for _ in range(6):
        _stream_events(base, "pair")
    assert fakes.states["bad"].num_requests == 2  # a break after the first byte, or no first token
    assert fakes.states["good"].num_requests >= 4
    ready = _ready(base)
    assert ready["replicas"]["pair"]["openai#0"] == "open" and ready["breakers"]["pair"] == "closed"


def test_every_replica_open_opens_the_model_and_the_fallback_answers(fakes):
    replicas = [{"base_url": fakes(name, FakeBehaviour(failure="500"))} for name in ("r0", "r1")]
    models = [
        {"name": "pair", "replicas": replicas, "fallbacks": ["spare"]},
        {"name": "spare", "base_url": fakes("spare")},
    ]
    base = fakes.proxy(models, {"max_attempts": 1, "breaker_fail_max": 1, "breaker_reset_s": 30})
    with _sdk(base) as sdk:
        for _ in range(4):
            raw = sdk.chat.completions.with_raw_response.create(model="pair", messages=HI)
            assert raw.headers["x-switchyard-model"] == "spare"
    assert fakes.states["r0"].num_requests == 1 and fakes.states["r1"].num_requests == 1
    ready = _ready(base)
    assert ready["breakers"]["pair"] == "open"
    assert ready["replicas"]["pair"] == {"openai#0": "open", "openai#1": "open"}


# -- 429 cooldowns ------------------------------------------------------------------------------


def test_a_429_cools_the_model_down_and_the_fallback_answers_meanwhile(fakes):
    base = _primary_with_fallback(fakes, {"max_attempts": 2, "max_retry_after_s": 5})
    fakes.states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=3, words=("a",))
    with _sdk(base) as sdk:
        models = [
            sdk.chat.completions.with_raw_response.create(model="primary", messages=HI).headers["x-switchyard-model"]
            for _ in range(4)
        ]
        assert models == ["secondary"] * 4
        assert fakes.states["a"].num_requests == 1  # not asked again while it cools down
        assert _ready(base)["cooldowns"]["primary"] == 3
        assert _ready(base)["breakers"]["primary"] == "closed"  # a 429 is not a failure
        fakes.states["a"].behaviour = FakeBehaviour(words=("a",))
        fakes.clock.advance(3)
        assert "primary" not in _ready(base)["cooldowns"]
        raw = sdk.chat.completions.with_raw_response.create(model="primary", messages=HI)
    assert raw.headers["x-switchyard-model"] == "primary"
    assert fakes.states["a"].num_requests == 2


def test_a_429_with_nowhere_else_to_go_is_a_rate_limit_with_the_remaining_retry_after(fakes):
    base = _primary_with_fallback(fakes, {"max_attempts": 1}, fallbacks=False)
    fakes.states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=4)
    with _sdk(base) as sdk:
        with pytest.raises(openai.RateLimitError) as first:
            sdk.chat.completions.create(model="primary", messages=HI)
        assert first.value.response.headers["retry-after"] == "4"
        fakes.clock.advance(1.2)
        with pytest.raises(openai.RateLimitError) as second:
            sdk.chat.completions.create(model="primary", messages=HI)
        error = second.value.response.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
        assert second.value.response.headers["retry-after"] == "3"  # what is left, rounded up: 4 - 1.2 s
        assert fakes.states["a"].num_requests == 1  # the cooling upstream was not called
        fakes.states["a"].behaviour = FakeBehaviour()
        fakes.clock.advance(2.8)
        assert not _ready(base)["cooldowns"]
        reply = sdk.chat.completions.create(model="primary", messages=HI)
    assert reply.choices[0].message.content.startswith("alpha")
    assert fakes.states["a"].num_requests == 2


def test_a_429_without_retry_after_still_tells_the_client_when_to_come_back(fakes):
    """The short default cooldown runs; the client hears it as Retry-After (at least 1)."""
    base = _primary_with_fallback(fakes, {"max_attempts": 1, "default_cooldown_s": 2}, fallbacks=False)
    fakes.states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=None)
    for _ in range(2):  # the upstream's 429, then the cooldown's refusal
        body = {"model": "primary", "messages": HI}
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=TIMEOUT_S)
        assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
        assert response.headers["retry-after"] == "2"
        fakes.clock.advance(0.5)
    assert fakes.states["a"].num_requests == 1
    fakes.clock.advance(1)  # the cooldown is over
    assert not _ready(base)["cooldowns"]


def test_a_cooling_model_whose_fallback_is_open_is_a_rate_limit_with_the_remaining_retry_after(fakes):
    """Nothing can answer only because of the cooldown (the fallback's circuit is open): 429, not 503."""
    base = _primary_with_fallback(fakes, {"max_attempts": 1, "breaker_fail_max": 1, "breaker_reset_s": 60})
    fakes.states["b"].behaviour = FakeBehaviour(failure="500")
    with _sdk(base) as sdk:
        with pytest.raises(openai.APIStatusError):
            sdk.chat.completions.create(model="secondary", messages=HI)  # opens the fallback's breaker
        assert _ready(base)["breakers"]["secondary"] == "open"
        fakes.states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=5)
        for left in ("5", "4"):  # the upstream's 429, then the cooldown's refusal 1.5 s later
            with pytest.raises(openai.RateLimitError) as info:
                sdk.chat.completions.create(model="primary", messages=HI)
            assert info.value.response.json()["error"]["code"] == "rate_limit_exceeded"
            # the cooldown's (not the open circuit's 1 s): what is left of its 5 s, rounded up
            assert info.value.response.headers["retry-after"] == left
            fakes.clock.advance(1.5)
    assert fakes.states["a"].num_requests == 1 and fakes.states["b"].num_requests == 1


def test_a_429_on_one_replica_sends_the_others_its_traffic(fakes):
    busy = fakes("busy", FakeBehaviour(failure="429", retry_after_s=30))
    free = fakes("free")
    base = fakes.proxy(
        [{"name": "pair", "replicas": [{"base_url": busy}, {"base_url": free}]}],
        {"max_attempts": 2, "backoff_base_s": 0, "max_cooldown_s": 5},
    )
    with _sdk(base) as sdk:
        replies = [sdk.chat.completions.with_raw_response.create(model="pair", messages=HI) for _ in range(6)]
    assert {r.status_code for r in replies} == {200}
    assert {r.headers["x-switchyard-backend"] for r in replies} == {"openai#1"}
    assert fakes.states["busy"].num_requests == 1
    cooldowns = _ready(base)["cooldowns"]
    assert cooldowns == {"pair/openai#0": 5}  # capped by max_cooldown_s


# -- failures after the first streamed byte -----------------------------------------------------


def _stream_events(base: str, model: str = "primary") -> tuple[str, list[str]]:
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={"model": model, "messages": HI, "stream": True}, timeout=TIMEOUT_S
    ) as response:
        events = [line for line in response.iter_lines() if line]
    return response.headers.get("x-switchyard-model", ""), events


@pytest.mark.parametrize("failure", ["drop", "malformed"])
def test_streams_that_break_mid_way_open_the_breaker(fakes, failure):
    base = _primary_with_fallback(fakes, {"max_attempts": 1, "breaker_fail_max": 3, "breaker_reset_s": 30})
    fakes.states["a"].behaviour = FakeBehaviour(failure=failure, num_tokens=5, drop_after=2)
    for _ in range(3):
        model, events = _stream_events(base)
        assert model == "primary"
        assert '"error"' in events[-2] and events[-1] == "data: [DONE]"  # in-band, after the first byte
    assert _ready(base)["breakers"]["primary"] == "open"
    model, events = _stream_events(base)
    assert model == "secondary" and events[-1] == "data: [DONE]"
    assert fakes.states["a"].num_requests == 3


def test_clients_that_leave_mid_stream_do_not_open_the_breaker(fakes):
    base = _primary_with_fallback(fakes, {"max_attempts": 1, "breaker_fail_max": 2, "breaker_reset_s": 30})
    # a stream that never ends by itself: only the client's leaving ends it upstream
    fakes.states["a"].behaviour = FakeBehaviour(num_tokens=ENDLESS, token_delay_s=0.02)
    body = {"model": "primary", "messages": HI, "stream": True}
    for number in range(4):
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=TIMEOUT_S) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")  # the first byte came; then the client leaves
        assert wait_until(lambda n=number: fakes.states["a"].records[n].disconnected_at is not None, TIMEOUT_S)
    assert _ready(base)["breakers"]["primary"] == "closed"
    fakes.states["a"].behaviour = FakeBehaviour()
    model, events = _stream_events(base)
    assert model == "primary" and events[-1] == "data: [DONE]"
