"""Fault injection against fake upstreams: breakers, retries, timeouts, fallbacks, shedding."""

from __future__ import annotations

import asyncio
import threading
from contextlib import ExitStack

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.clock import freeze_breakers
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread, stop_server
from tests.helpers import wait_until

HI = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30  # bounds a hang only: every request below that is meant to answer does so far sooner


@pytest.fixture
def pair():
    """Two fake upstreams, 'a' (primary) and 'b' (fallback), and a way to start a proxy on them."""
    states = {"a": FakeState(), "b": FakeState(behaviour=FakeBehaviour(words=("fallback",)))}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}

        def proxy(resilience: dict, fallbacks: bool = True, primary: dict | None = None) -> str:
            """`primary`: the primary model's own settings (its first-token timeout, say)."""
            settings = Settings(
                models=[
                    {"name": "primary", "base_url": urls["a"], "fallbacks": ["secondary"] if fallbacks else []}
                    | (primary or {}),
                    {"name": "secondary", "base_url": urls["b"]},
                ],
                resilience=resilience,
                upstream={"read_timeout_s": TIMEOUT_S},
            )
            proxy.app = create_app(settings)
            return stack.enter_context(serve_in_thread(proxy.app))

        proxy.urls = urls
        yield states, proxy


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT_S)


def test_a_500_storm_opens_the_breaker_and_half_open_recovers(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 1, "breaker_fail_max": 3, "breaker_reset_s": 30}, fallbacks=False)
    clock = freeze_breakers(proxy.app)  # open until the test lets the reset pass, however slow the machine
    states["a"].behaviour.failure = "500"
    with _sdk(base) as sdk:
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                sdk.chat.completions.create(model="primary", messages=HI)
        with pytest.raises(openai.InternalServerError) as info:
            sdk.chat.completions.create(model="primary", messages=HI)
        assert info.value.status_code == 503
        assert "circuit open" in info.value.response.json()["error"]["message"]
        assert states["a"].num_requests == 3  # the open breaker did not call the upstream
        assert httpx.get(base + "/health/ready").json()["breakers"]["primary"] == "open"
        metrics = httpx.get(base + "/metrics").text
        assert 'switchyard_breaker_state{model="primary"} 2' in metrics
        assert 'switchyard_attempts_total{model="primary",status="failed"} 4' in metrics
        states["a"].behaviour.failure = None
        clock.advance(30)  # breaker_reset_s
        assert httpx.get(base + "/health/ready").json()["breakers"]["primary"] == "half-open"
        reply = sdk.chat.completions.create(model="primary", messages=HI)  # the half-open trial
    assert reply.choices[0].message.content.startswith("alpha")
    assert httpx.get(base + "/health/ready").json()["breakers"]["primary"] == "closed"


def test_429_with_retry_after_is_waited_out_then_retried(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 2, "max_retry_after_s": 2}, fallbacks=False)
    states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=1, fail_times=1)
    with _sdk(base) as sdk:
        reply = sdk.chat.completions.create(model="primary", messages=HI)
    assert reply.choices[0].message.content.startswith("alpha")
    first, second = states["a"].records
    # not sent again before the upstream's Retry-After had passed (a backoff would be at most 0.1 s);
    # a lower bound the proxy guarantees whatever the machine's speed: the wait starts after the 429
    assert second.started_at - first.started_at >= 1.0


def test_a_hang_hits_the_first_token_timeout_and_falls_back(pair):
    """The primary's own short first-token timeout; the fallback that answers keeps the default."""
    states, proxy = pair
    base = proxy({"max_attempts": 1}, primary={"first_token_timeout_s": 0.3})
    states["a"].behaviour.failure = "hang"
    with _sdk(base) as sdk:
        with sdk.chat.completions.with_streaming_response.create(model="primary", messages=HI, stream=True) as response:
            assert response.headers["x-switchyard-model"] == "secondary"
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text.startswith("fallback")
    assert wait_until(lambda: states["a"].records[-1].disconnected_at is not None, timeout_s=TIMEOUT_S)


def test_a_stream_over_its_total_time_ends_with_an_in_band_timeout(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 1, "attempt_timeout_s": 0.3}, fallbacks=False)
    # 2.5 s of tokens at the least: the attempt's 0.3 s (counted from its first chunk) always cuts it
    states["a"].behaviour = FakeBehaviour(num_tokens=50, token_delay_s=0.05)
    with httpx.stream(
        "POST",
        base + "/v1/chat/completions",
        json={"model": "primary", "messages": HI, "stream": True},
        timeout=TIMEOUT_S,
    ) as response:
        events = [line for line in response.iter_lines() if line]
    assert response.status_code == 200
    assert '"code":"upstream_timeout"' in events[-2] and events[-1] == "data: [DONE]"
    assert 2 < len(events) < 50
    assert wait_until(lambda: states["a"].records[-1].disconnected_at is not None, timeout_s=TIMEOUT_S)


def test_fallbacks_contract_names_the_model_that_answered(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 2, "backoff_base_s": 0.01})
    states["a"].behaviour.failure = "500"
    with _sdk(base) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(model="primary", messages=HI)
    assert raw.headers["x-switchyard-model"] == "secondary"
    assert raw.parse().choices[0].message.content.startswith("fallback")
    assert states["a"].num_requests == 2 and states["b"].num_requests == 1


def test_a_content_policy_refusal_is_not_retried_nor_passed_on(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 3})
    states["a"].behaviour.failure = "400"
    with _sdk(base) as sdk, pytest.raises(openai.BadRequestError, match="safety system"):
        sdk.chat.completions.create(model="primary", messages=HI)
    assert states["a"].num_requests == 1 and states["b"].num_requests == 0


def test_a_context_window_error_falls_back_to_the_next_model(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 3})
    states["a"].behaviour.failure = "context"
    with _sdk(base) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(model="primary", messages=HI)
    assert raw.headers["x-switchyard-model"] == "secondary"
    assert states["a"].num_requests == 1  # not retried on the same model
    states["b"].behaviour.failure = "context"
    with _sdk(base) as sdk, pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="primary", messages=HI)
    assert info.value.response.json()["error"]["code"] == "context_length_exceeded"


def test_all_attempts_failed_lists_each_and_picks_429_for_rate_limits(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 2, "max_retry_after_s": 0, "backoff_base_s": 0.01})
    clock = freeze_breakers(proxy.app)
    for state in states.values():
        state.behaviour = FakeBehaviour(failure="429", retry_after_s=1)
    with _sdk(base) as sdk, pytest.raises(openai.RateLimitError) as info:
        sdk.chat.completions.create(model="primary", messages=HI)
    error = info.value.response.json()["error"]
    # each 429 cools its model down: not asked again, the chain moves on
    assert error["message"].startswith("All 2 attempts failed: primary: 429")
    assert error["message"].count("secondary: 429") == 1
    assert info.value.response.headers["retry-after"] == "1"
    states["b"].behaviour = FakeBehaviour(failure="500")
    clock.advance(1)  # the cooldowns are over
    assert httpx.get(base + "/health/ready").json()["cooldowns"] == {}
    with _sdk(base) as sdk, pytest.raises(openai.InternalServerError) as info:
        sdk.chat.completions.create(model="primary", messages=HI)
    assert info.value.status_code == 502


def test_load_shedding_answers_429_instead_of_queueing(pair):
    states, proxy = pair
    base = proxy({"max_in_flight": 1, "max_attempts": 1}, fallbacks=False)
    held = threading.Event()
    states["a"].behaviour = FakeBehaviour(wait_for=held)  # the first request stays in flight upstream

    async def a_second_while_the_first_is_held():
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:
            first = asyncio.create_task(sdk.chat.completions.create(model="primary", messages=HI))
            try:
                assert await asyncio.to_thread(states["a"].arrived.wait, TIMEOUT_S)
                with pytest.raises(openai.RateLimitError) as shed:
                    await sdk.chat.completions.create(model="primary", messages=HI)
            finally:
                held.set()
            return shed.value, await first

    shed, answer = asyncio.run(a_second_while_the_first_is_held())
    assert shed.response.headers["retry-after"] == "1"
    assert answer.choices[0].message.content
    assert states["a"].num_requests == 1


@pytest.mark.slow
def test_a_backend_killed_under_200_concurrent_requests(pair):
    states, proxy = pair
    for state in states.values():
        state.behaviour = FakeBehaviour(num_tokens=20, token_delay_s=0.02, words=state.behaviour.words)
    base = proxy({"max_attempts": 1, "first_token_timeout_s": 10})  # bounds a stream the kill left hanging
    counts = asyncio.run(
        _storm(
            base,
            200,
            is_under_way=lambda: states["a"].num_requests >= 50,
            stop=lambda: _kill(states["a"], proxy.urls["a"]),
        )
    )
    assert counts["answered"] + counts["clean_error"] == 200, counts
    assert counts["other"] == 0, counts
    assert counts["answered"] > 0 and states["b"].num_requests > 0  # the fallback took over


def _kill(state: FakeState, url: str) -> None:
    """The upstream dies: streams in flight drop, new connections are refused."""
    state.is_dead = True
    stop_server(url.removesuffix("/v1"))


async def _storm(front: str, n: int, *, is_under_way, stop) -> dict[str, int]:
    """Half the requests, spread out; once `is_under_way()` (some of them are upstream), `stop()`;
    then the other half, all after the kill."""
    counts = {"answered": 0, "clean_error": 0, "other": 0}
    others: list[str] = []
    async with openai.AsyncOpenAI(base_url=front + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:

        async def one(i: int) -> None:
            await asyncio.sleep((i % (n // 2)) * 0.005)  # arrivals spread out: the kill meets them at every stage
            try:
                stream = await sdk.chat.completions.create(model="primary", messages=HI, stream=True)
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
                counts["answered" if text else "other"] += 1
                if not text:
                    others.append("empty answer")
            except openai.APIStatusError as exc:
                body = exc.response.json()
                counts["clean_error" if set(body.get("error", {})) >= {"message", "type", "code"} else "other"] += 1
            except openai.APIError:
                counts["clean_error"] += 1  # an in-band error after the first byte
            except Exception as exc:
                counts["other"] += 1
                others.append(f"{type(exc).__name__}: {exc}")

        before = [asyncio.create_task(one(i)) for i in range(n // 2)]
        assert await asyncio.to_thread(wait_until, is_under_way, TIMEOUT_S)
        await asyncio.to_thread(stop)
        after = [asyncio.create_task(one(i)) for i in range(n // 2, n)]
        await asyncio.gather(*before, *after)
    counts["other_reasons"] = sorted(set(others))
    return counts


def test_upstream_429s_are_passed_on_and_never_open_the_breaker(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 1, "breaker_fail_max": 2, "max_retry_after_s": 1}, fallbacks=False)
    clock = freeze_breakers(proxy.app)
    states["a"].behaviour = FakeBehaviour(failure="429", retry_after_s=7)
    responses = []
    for _ in range(5):
        body = {"model": "primary", "messages": HI}
        responses.append(httpx.post(base + "/v1/chat/completions", json=body, timeout=TIMEOUT_S))
        clock.advance(1.5)
    assert [r.status_code for r in responses] == [429] * 5  # never 503 "circuit open"
    assert {r.json()["error"]["code"] for r in responses} == {"rate_limit_exceeded"}
    # the upstream's, then what is left of the cooldown, rounded up: 7 - 1.5, 7 - 3, 7 - 4.5, 7 - 6
    assert [r.headers["retry-after"] for r in responses] == ["7", "6", "4", "3", "1"]
    assert states["a"].num_requests == 1  # the others were not sent while it cools down
    assert httpx.get(base + "/health/ready").json()["breakers"]["primary"] == "closed"


async def test_a_half_open_breaker_lets_exactly_one_trial_through(pair):
    states, proxy = pair
    base = proxy({"max_attempts": 1, "breaker_fail_max": 1, "breaker_reset_s": 30}, fallbacks=False)
    clock = freeze_breakers(proxy.app)
    states["a"].behaviour = FakeBehaviour(failure="500", fail_times=1)
    body = {"model": "primary", "messages": HI}
    async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT_S) as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code in (502, 503)  # it opens
        recovered = threading.Event()
        # recovered, but it holds the trial until the whole burst has met it
        states["a"].behaviour = FakeBehaviour(wait_for=recovered)
        clock.advance(30)  # past breaker_reset_s: the next request is the trial
        posts = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(10)]
        try:
            answered, held = [], set(posts)
            async with asyncio.timeout(TIMEOUT_S):  # all but the trial are refused while it is held
                while len(answered) < 9:
                    done, held = await asyncio.wait(held, return_when=asyncio.FIRST_COMPLETED)
                    answered += done
        finally:
            recovered.set()
        burst = await asyncio.gather(*posts)
        after = await client.post("/v1/chat/completions", json=body)
    assert sorted(r.status_code for r in burst) == [200] + [503] * 9
    refused = [r.json()["error"]["message"] for r in burst if r.status_code == 503]
    assert all("half-open" in m or "circuit open" in m for m in refused)
    assert after.status_code == 200  # the trial succeeded: closed again
    assert states["a"].num_requests == 1 + 1 + 1  # the failure, the one trial, the request after
