"""Deadlines by default: a hung upstream (no answer, headers then nothing, a few tokens then
nothing) costs a request its first-token timeout, not the read timeout; a non-stream answer is
streamed from the upstream and assembled, so a long one still arrives whole; no request outlives
its deadline; repeated first-token timeouts open the breaker.

The timeouts are scaled down, and what times out never answers (a hang, a stall, an endless
stream); what must arrive before a timeout (a first chunk, a whole answer) is given `ROOM_S`, far
more than a busy machine needs. The clients' own timeout (`HANG_GUARD_S`) only catches a hang.
"""

from __future__ import annotations

import re
from contextlib import ExitStack

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

HI = [{"role": "user", "content": "hi"}]
HANG_GUARD_S = 30.0  # far beyond every timeout configured below: reaching it means a hang
ROOM_S = 2.0  # a timeout that something meant to arrive must beat: a busy machine needs a fraction of it
ENDLESS = 100_000  # tokens: a healthy stream that outlasts any test


@pytest.fixture
def upstreams():
    """Three fake upstreams, 'a' falls back to 'b' then 'c'; `proxy(resilience, models=...)` serves them."""
    states = {name: FakeState(behaviour=FakeBehaviour(words=(name,))) for name in "abc"}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}

        def proxy(
            resilience: dict, *, chain: str = "a", upstream: dict | None = None, model_b: dict | None = None, **model_a
        ) -> str:
            # asked as streams and assembled (not the default): what the first-token timeout guards
            models = [{"name": name, "base_url": urls[name]} for name in "abc"]
            models[0] |= {"fallbacks": list(chain[1:])} | model_a
            models[1] |= model_b or {}
            upstream = {"read_timeout_s": 30} | (upstream or {})
            settings = Settings(models=models, resilience=resilience, upstream=upstream)
            return stack.enter_context(serve_in_thread(create_app(settings)))

        proxy.urls = urls
        yield states, proxy


def _sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=HANG_GUARD_S)


def _events(base: str, body: dict) -> tuple[int, list[str]]:
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=HANG_GUARD_S) as response:
        return response.status_code, [line for line in response.iter_lines() if line]


@pytest.mark.parametrize("failure", ["hang", "headers"])
def test_a_non_stream_request_to_a_hung_upstream_is_a_504_after_its_first_token_timeout(upstreams, failure):
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.3, "max_attempts": 2})
    states["a"].behaviour.failure = failure
    with _sdk(base) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="a", messages=HI)
    assert info.value.status_code == 504
    assert info.value.response.json()["error"]["code"] == "upstream_timeout"
    assert "no first token within 0.3 s" in info.value.response.json()["error"]["message"]
    assert states["a"].num_requests == 1  # a first-token timeout is not retried on the same model


@pytest.mark.parametrize("failure", ["hang", "headers"])
def test_a_stream_to_a_hung_upstream_is_a_504_before_the_first_byte(upstreams, failure):
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.3})
    states["a"].behaviour.failure = failure
    status, events = _events(base, {"model": "a", "messages": HI, "stream": True})
    assert status == 504 and "upstream_timeout" in events[0]


def test_a_stream_that_stalls_after_a_few_tokens_ends_in_band_at_the_request_deadline(upstreams):
    """The deadline leaves the two chunks room to arrive; the stall after them is what it cuts."""
    states, proxy = upstreams
    base = proxy({"request_timeout_s": ROOM_S})
    states["a"].behaviour = FakeBehaviour(failure="stall", drop_after=2)
    status, events = _events(base, {"model": "a", "messages": HI, "stream": True})
    assert status == 200 and len(events) == 4  # two chunks, the error, [DONE]
    assert '"code":"upstream_timeout"' in events[-2] and f"request deadline of {ROOM_S:g} s" in events[-2]
    assert events[-1] == "data: [DONE]"


def test_a_non_stream_answer_that_stalls_is_a_504_at_the_request_deadline(upstreams):
    """Whether the first chunks arrive before the deadline or not, the deadline is what ends it."""
    states, proxy = upstreams
    base = proxy({"request_timeout_s": 1.0})
    states["a"].behaviour = FakeBehaviour(failure="stall", drop_after=2)
    with _sdk(base) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="a", messages=HI)
    assert info.value.status_code == 504 and "request deadline of 1 s" in info.value.message


def test_a_stream_that_stalls_ends_in_band_at_the_stream_idle_timeout(upstreams):
    """Long before the request deadline: a started stream silent for upstream.stream_idle_timeout_s
    (which the first-token timeout, no longer than it, leaves as it is)."""
    states, proxy = upstreams
    resilience = {"first_token_timeout_s": ROOM_S, "request_timeout_s": 60, "max_attempts": 1}
    base = proxy(resilience, upstream={"stream_idle_timeout_s": ROOM_S})
    states["a"].behaviour = FakeBehaviour(failure="stall", drop_after=2)
    status, events = _events(base, {"model": "a", "messages": HI, "stream": True})
    assert status == 200 and len(events) == 4  # two chunks, the error, [DONE]
    assert '"code":"upstream_timeout"' in events[-2] and "openai#0" in events[-2]
    assert events[-1] == "data: [DONE]"
    with _sdk(base) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="a", messages=HI)  # asked as a stream, assembled: the same cut
    assert info.value.status_code == 504 and info.value.response.json()["error"]["code"] == "upstream_timeout"


def test_a_slow_plain_answer_is_not_cut_by_the_stream_idle_timeout(upstreams):
    """assemble_from_stream: false sends a plain request, bounded by read_timeout_s only."""
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.15}, upstream={"stream_idle_timeout_s": 0.2}, assemble_from_stream=False)
    states["a"].behaviour = FakeBehaviour(num_tokens=8, latency_s=0.6, words=("a",))  # silent, then all of it
    with _sdk(base) as sdk:
        answer = sdk.chat.completions.create(model="a", messages=HI)
        assert answer.usage.completion_tokens == 8
        states["a"].behaviour = FakeBehaviour(failure="hang")  # the same silence, never ending
        status, events = _events(base, {"model": "a", "messages": HI, "stream": True})
    assert status == 504 and "upstream_timeout" in events[0]  # the same silence in a stream is cut
    assert "no first token within 0.15 s" in events[0]  # (the plain request had no first-token timeout)


def _without_identity(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 2}),
        ("/chat/completions", {"messages": HI, "max_tokens": 7}),
        ("/completions", {"prompt": "say", "logprobs": 2}),
    ],
)
def test_a_long_non_stream_answer_is_assembled_from_the_stream_as_the_upstream_would_send_it(upstreams, path, body):
    """The answer takes longer in all than the first-token timeout (the pauses after its first chunk
    alone do: 8 of them at the least, 7 tokens, the last chunk and usage): it still arrives, equal to
    the upstream's own non-stream answer (usage and logprobs included)."""
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": ROOM_S})
    states["a"].behaviour = FakeBehaviour(num_tokens=10, token_delay_s=ROOM_S / 7, words=("a", "b", "c"))
    quick = {"fake": {"token_delay_s": 0}}  # the same answer, asked of the upstream directly, at once
    upstream = httpx.post(proxy.urls["a"] + path, json={"model": "a", **body, **quick}, timeout=HANG_GUARD_S).json()
    reply = httpx.post(base + "/v1" + path, json={"model": "a", **body}, timeout=HANG_GUARD_S)
    assert reply.status_code == 200, reply.text
    assembled = reply.json()
    assert _without_identity(assembled) == _without_identity(upstream)
    assert assembled["id"] == "chunk-fake"  # the stream's own id, kept
    sent = states["a"].records[-1].body
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_a_model_that_does_not_assemble_sends_a_plain_non_stream_request(upstreams):
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.2}, assemble_from_stream=False)
    states["a"].behaviour = FakeBehaviour(num_tokens=10, token_delay_s=0.05, latency_s=0.4)
    with _sdk(base) as sdk:
        reply = sdk.chat.completions.create(model="a", messages=HI)  # no first-token timeout: the answer
    assert reply.usage.completion_tokens == 10
    assert "stream" not in states["a"].records[-1].body


def test_a_models_first_token_timeout_beats_the_global_one(upstreams):
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.2}, first_token_timeout_s=10.0)
    states["a"].behaviour.latency_s = 0.5  # silent longer than the global timeout, well within its own
    with _sdk(base) as sdk:
        assert sdk.chat.completions.create(model="a", messages=HI).choices[0].message.content.startswith("a")
    states["b"].behaviour.failure = "hang"  # b has no override: the global 0.2 s applies
    with _sdk(base) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="b", messages=HI)
    assert info.value.status_code == 504
    assert "no first token within 0.2 s" in info.value.response.json()["error"]["message"]


def test_a_models_request_timeout_beats_the_global_one(upstreams):
    """Asked as a whole answer: a 504 at the model's deadline, whether the stall's first chunks beat it or not."""
    states, proxy = upstreams
    base = proxy({"request_timeout_s": 600}, request_timeout_s=0.5)
    states["a"].behaviour = FakeBehaviour(failure="stall", drop_after=2)
    response = httpx.post(base + "/v1/chat/completions", json={"model": "a", "messages": HI}, timeout=HANG_GUARD_S)
    assert response.status_code == 504 and "request deadline of 0.5 s" in response.text


def test_a_hung_chain_ends_within_the_first_token_budget(upstreams):
    """Retries and fallbacks: each hung model is tried once, and no attempt starts once the budget
    is spent (with the defaults, 20 s per model and 45 s in all: under a minute). b's own timeout
    is longer than the budget: it waits for what is left, which a slow machine only makes shorter."""
    states, proxy = upstreams
    budget_s = 0.3 + ROOM_S
    resilience = {"first_token_timeout_s": 0.3, "first_token_budget_s": budget_s, "max_attempts": 2}
    base = proxy(resilience, chain="abc", model_b={"first_token_timeout_s": 30})
    for state in states.values():
        state.behaviour.failure = "hang"
    with _sdk(base) as sdk, pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="a", messages=HI)
    assert info.value.status_code == 504
    message = info.value.response.json()["error"]["message"]
    assert "a: no first token within 0.3 s" in message
    left = re.search(r"b: no first token within ([0-9.]+) s", message)
    assert left is not None, message
    assert 0 < float(left.group(1)) <= ROOM_S  # what was left of the budget after a's 0.3 s, not b's own 30 s
    assert f"no first token within the budget of {budget_s:g} s" in message
    assert [s.num_requests for s in states.values()] == [1, 1, 0]


def test_repeated_first_token_timeouts_open_the_breaker(upstreams):
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 0.2, "breaker_fail_max": 3, "breaker_reset_s": 60})
    states["a"].behaviour.failure = "hang"
    with _sdk(base) as sdk:
        for _ in range(3):
            with pytest.raises(openai.APIStatusError) as info:
                sdk.chat.completions.create(model="a", messages=HI)
            assert info.value.status_code in (504, 503)  # the third trips the breaker: 503 circuit open
        with pytest.raises(openai.APIStatusError) as info:
            sdk.chat.completions.create(model="a", messages=HI)
    assert info.value.status_code == 503 and "circuit open" in info.value.message
    assert states["a"].num_requests == 3  # the open breaker did not call the hung upstream again
    assert httpx.get(base + "/health/ready").json()["breakers"]["a"] == "open"


def _metrics(base: str) -> str:
    return httpx.get(base + "/metrics", timeout=HANG_GUARD_S).text


def test_an_attempt_cut_by_the_request_deadline_is_metered_as_failed(upstreams):
    """Cut before or after the stall's first chunks: a call the deadline cut either way."""
    states, proxy = upstreams
    base = proxy({"request_timeout_s": 1.0})
    states["a"].behaviour = FakeBehaviour(failure="stall", drop_after=2)
    response = httpx.post(base + "/v1/chat/completions", json={"model": "a", "messages": HI}, timeout=HANG_GUARD_S)
    assert response.status_code == 504 and "request deadline of 1 s" in response.text
    assert 'switchyard_attempts_total{model="a",status="failed"} 1' in _metrics(base)


def test_healthy_answers_cut_by_the_request_deadline_do_not_open_the_breaker(upstreams):
    """The client's deadline, not the upstream's fault: the cut attempts are metered, the breaker
    hears nothing (a stall is caught by the stream idle and first-token timeouts, which do count)."""
    states, proxy = upstreams
    base = proxy({"request_timeout_s": ROOM_S, "breaker_fail_max": 2, "max_attempts": 1})
    states["a"].behaviour = FakeBehaviour(num_tokens=ENDLESS, token_delay_s=0.02)  # steady tokens, never done
    deadline = f"request deadline of {ROOM_S:g} s"
    status, events = _events(base, {"model": "a", "messages": HI, "stream": True})
    assert status == 200 and deadline in events[-2] and events[-1] == "data: [DONE]"
    response = httpx.post(base + "/v1/chat/completions", json={"model": "a", "messages": HI}, timeout=HANG_GUARD_S)
    assert response.status_code == 504 and deadline in response.text
    # two cut attempts, breaker_fail_max of them: failures would have opened it
    failed = 'switchyard_attempts_total{model="a",status="failed"} 2'
    assert wait_until(lambda: failed in _metrics(base), timeout_s=HANG_GUARD_S)  # the stream's, once it has ended
    assert httpx.get(base + "/health/ready").json()["breakers"]["a"] == "closed"
    states["a"].behaviour = FakeBehaviour()
    with _sdk(base) as sdk:
        assert sdk.chat.completions.create(model="a", messages=HI).choices[0].message.content


def test_a_global_first_token_timeout_longer_than_the_stream_idle_timeout_is_kept(upstreams):
    """The upstream's idle timeout must not cut the wait for the first token first (as a read
    timeout, retried on the same hung model)."""
    states, proxy = upstreams
    base = proxy({"first_token_timeout_s": 1.0, "max_attempts": 2}, upstream={"stream_idle_timeout_s": 0.3})
    states["a"].behaviour.failure = "hang"
    response = httpx.post(base + "/v1/chat/completions", json={"model": "a", "messages": HI}, timeout=HANG_GUARD_S)
    assert response.status_code == 504 and "no first token within 1 s" in response.text
    assert states["a"].num_requests == 1  # a first-token timeout is not retried on the same model


def test_a_malformed_chunk_in_an_assembled_answer_is_a_502_upstream_error_and_counts(upstreams):
    states, proxy = upstreams
    base = proxy({"breaker_fail_max": 2, "breaker_reset_s": 60, "max_attempts": 1})
    states["a"].behaviour = FakeBehaviour(failure="bad_shape")
    for _ in range(2):
        response = httpx.post(base + "/v1/chat/completions", json={"model": "a", "messages": HI}, timeout=HANG_GUARD_S)
        assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_error"
    assert 'switchyard_attempts_total{model="a",status="failed"} 2' in _metrics(base)
    assert httpx.get(base + "/health/ready").json()["breakers"]["a"] == "open"
