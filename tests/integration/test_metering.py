"""Every attempt lands in the usage ledger once: completed, failed or cancelled, linked by request id."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import post_unread, wait_for_records, wait_until

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def metered(tmp_path):
    states = {"a": FakeState(), "b": FakeState()}
    with ExitStack() as stack:
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
        settings = Settings(
            models=[
                {
                    "name": "primary",
                    "base_url": urls["a"],
                    "fallbacks": ["secondary"],
                    "price": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0},
                },
                {"name": "secondary", "base_url": urls["b"]},
            ],
            resilience={"max_attempts": 2, "backoff_base_s": 0.01},
            billing={"ledger_path": tmp_path / "usage.db"},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        yield base, states, app


def _records(app, request_id: str, count: int, *, by_client_id: bool = False):
    key = "client_request_id" if by_client_id else "request_id"
    return wait_for_records(app, count, timeout_s=30, **{key: request_id})


def test_a_completed_request_is_one_record_with_tokens_and_cost(metered):
    base, _, app = metered
    with openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=30) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(model="primary", messages=HI)
    usage = raw.parse().usage
    [record] = _records(app, raw.headers["x-request-id"], 1)
    assert (record.status, record.attempt, record.model) == ("completed", 1, "primary")
    assert record.backend == "openai#0"  # the deployment, never its address
    assert (record.prompt_tokens, record.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert record.cost_usd == pytest.approx((usage.prompt_tokens * 1.0 + usage.completion_tokens * 2.0) / 1e6)
    assert not record.is_estimated


def test_a_stream_is_metered_from_its_usage_even_when_the_client_did_not_ask(metered):
    base, _, app = metered
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={"model": "primary", "messages": HI, "stream": True}, timeout=30
    ) as response:
        body = response.read()
        request_id = response.headers["x-request-id"]
    assert b'"usage"' not in body
    [record] = _records(app, request_id, 1)
    assert record.status == "completed" and record.completion_tokens == 5 and not record.is_estimated


def test_a_stream_dropped_mid_way_ends_in_band_and_is_metered_as_failed(metered):
    base, states, app = metered
    with httpx.stream(
        "POST",
        base + "/v1/chat/completions",
        json={"model": "primary", "messages": HI, "stream": True, "fake": {"failure": "drop", "drop_after": 2}},
        timeout=30,
    ) as response:
        events = [line for line in response.iter_lines() if line]
        request_id = response.headers["x-request-id"]
    assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
    [record] = _records(app, request_id, 1)
    assert record.status == "failed"
    assert record.completion_tokens == 2 and record.is_estimated  # counted from the chunks that arrived
    assert "dropped the connection" in record.error


def test_a_client_that_leaves_is_metered_as_cancelled(metered):
    base, states, app = metered
    # 10,000 tokens 0.05 s apart: still streaming when the client leaves, however slow the machine
    states["a"].behaviour = FakeBehaviour(num_tokens=10_000, token_delay_s=0.05)
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={"model": "primary", "messages": HI, "stream": True}, timeout=30
    ) as response:
        lines = response.iter_lines()
        next(lines)
        next(lines)
        request_id = response.headers["x-request-id"]
    [record] = _records(app, request_id, 1)
    assert record.status == "cancelled"


def test_every_attempt_of_a_fallback_chain_is_a_record(metered):
    base, states, app = metered
    states["a"].behaviour.failure = "500"
    with openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=30) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(model="primary", messages=HI)
    records = _records(app, raw.headers["x-request-id"], 3)
    assert [(r.attempt, r.model, r.status) for r in records] == [
        (1, "primary", "failed"),
        (2, "primary", "failed"),
        (3, "secondary", "completed"),
    ]
    assert "500" in records[0].error
    assert records[2].cost_usd == 0.0  # secondary has no price


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_before_the_first_byte_cancels_the_upstream_and_is_metered(metered, stream):
    base, states, app = metered
    states["a"].behaviour = FakeBehaviour(failure="hang")  # no first token until the proxy lets go
    request_id = f"req-left-early-{stream}"
    with post_unread(base, {"model": "primary", "messages": HI, "stream": stream}, {"x-request-id": request_id}):
        assert wait_until(states["a"].arrived.is_set, timeout_s=30)  # at the model: now the client leaves
    upstream = states["a"].records[-1]
    # the proxy lets go of the upstream at once (else only at its first-token timeout, 20 s, and then
    # with a fallback to "secondary", which the record and the count below would show)
    assert wait_until(lambda: upstream.disconnected_at is not None, timeout_s=30)
    [record] = _records(app, request_id, 1, by_client_id=True)
    assert (record.model, record.status) == ("primary", "cancelled")
    assert states["b"].num_requests == 0  # a cancellation is not a failure: no fallback


def test_an_answer_assembled_without_usage_is_estimated_as_its_stream_would_be(metered):
    """An upstream that ignores include_usage: the non-stream answer (assembled from its stream) is
    metered from the chunks, a chunk a token, as the same answer streamed is; not as 0 tokens, $0."""
    base, states, app = metered
    states["a"].behaviour = FakeBehaviour(num_tokens=20, sends_usage=False)
    body = {"model": "primary", "messages": [{"role": "user", "content": "hi " * 100}]}
    whole = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert whole.status_code == 200 and "usage" not in whole.json()
    assert float(whole.headers["x-switchyard-cost-usd"]) > 0
    streamed = httpx.post(base + "/v1/chat/completions", json=body | {"stream": True}, timeout=30)
    [one] = _records(app, whole.headers["x-request-id"], 1)
    [other] = _records(app, streamed.headers["x-request-id"], 1)
    assert one.is_estimated and other.is_estimated and one.completion_tokens > 0
    assert (one.prompt_tokens, one.completion_tokens, one.cost_usd) == (
        other.prompt_tokens,
        other.completion_tokens,
        other.cost_usd,
    )


def _cut_answer(tmp_path, resilience: dict, stream: bool) -> tuple[int, Any]:
    """An upstream that sends 3 chunks then stalls, cut by `resilience`'s limit: the status the
    client got and the request's one ledger record."""
    state = FakeState(behaviour=FakeBehaviour(failure="stall", drop_after=3))
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        price = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
        settings = Settings(
            models=[{"name": "a", "base_url": url, "price": price}],
            resilience={"first_token_timeout_s": 30, **resilience},
            upstream={"read_timeout_s": 30},
            billing={"ledger_path": tmp_path / "usage.db"},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        body = {"model": "a", "messages": HI, "stream": stream}
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
        [record] = _records(app, response.headers["x-request-id"], 1)
    return response.status_code, record


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_by_the_request_deadline_is_metered_as_failed_with_its_chunks(tmp_path, stream):
    """A non-stream answer (assembled) cut mid-way costs what its stream would: the chunks that came."""
    # the deadline cuts the stalled answer; the first chunks come well within it on any machine
    status, record = _cut_answer(tmp_path, {"request_timeout_s": 3.0}, stream)
    assert status == (200 if stream else 504)
    assert (record.status, record.completion_tokens, record.is_estimated) == ("failed", 3, True)
    assert "request deadline of 3 s" in record.error and record.cost_usd > 0


def test_an_answer_cut_by_the_attempt_timeout_is_metered_as_failed_with_its_chunks(tmp_path):
    """The attempt's own timeout, as the request's deadline: the assembled answer's chunks are metered."""
    status, record = _cut_answer(tmp_path, {"attempt_timeout_s": 3.0, "max_attempts": 1}, stream=False)
    assert status == 504
    assert (record.status, record.completion_tokens, record.is_estimated) == ("failed", 3, True)
    assert "no answer within 3 s" in record.error and record.cost_usd > 0
