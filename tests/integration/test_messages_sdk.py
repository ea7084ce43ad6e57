"""`POST /v1/messages` and `/v1/messages/count_tokens` with the real `anthropic` SDK: Anthropic's
Messages API answered by the chat path.

One proxy (module-scoped) in front of two fake OpenAI upstreams, `m-small` (unsure of itself: a
cascade climbs past it) and `m-large` (priced), and a fake Anthropic upstream reached through
LiteLLM (`claude`); teams with keys, a budget and a rate limit; `auto` (the classifier's score read
out of the prompt), a cascade, and `model_aliases` for the names Claude Code sends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextlib import ExitStack

import anthropic
import httpx
import numpy as np
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_for_records, wait_until

PRICE = {"input_usd_per_mtok": 0, "output_usd_per_mtok": 200.0}  # the fake's 5 answer tokens: $0.001
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HI = [{"role": "user", "content": "hi"}]
ALIASES = {
    "claude-*haiku*": {"model": "auto", "quality": "economy"},
    "claude-*sonnet*": "auto",
    "claude-opus-*": "claude",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("messages")
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    claude = AnthropicState()
    thresholds = tmp / "thresholds.yaml"
    thresholds.write_text(
        "version: 1\nrouting:\n  router: classifier\n  threshold: 0.45\n  modes:\n    economy: {threshold: 0.7}\n"
    )
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(claude)))
        settings = Settings(
            models=[
                {"name": "m-small", "base_url": urls["small"], "tier": "small"},
                {"name": "m-large", "base_url": urls["large"], "tier": "large", "price": PRICE},
                {"name": "m-plain", "base_url": urls["large"], "capabilities": {"tools": False, "vision": False}},
                {"name": "m-down", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
                {
                    "name": "claude",
                    "backend": "litellm",
                    "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                    "base_url": anthropic_url,
                    "api_key": "sk-ant-test",
                },
            ],
            routing={
                "thresholds_file": thresholds,
                "auto": {
                    "tiers": ["small", "large"],
                    "warm_up": False,
                    "max_wait_ms": 1,
                    "deadline_ms": 10_000,
                },
            },
            cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
            teams={
                "dev": {"api_keys": ["sk-dev"]},
                "web": {"api_keys": ["sk-web"], "models": ["m-large"]},
                "limited": {"api_keys": ["sk-limited"], "rpm": 1},
                "broke": {"api_keys": ["sk-broke"], "budget_usd_per_day": 0.0015},  # one answer, then spent
            },
            model_aliases=ALIASES,
            server={"max_body_bytes": 64 * 1024},
            upstream={"health_timeout_s": 30},
            resilience={"max_attempts": 1},
            billing={"ledger_path": tmp / "usage.db", "spill_path": tmp / "spill.jsonl"},
        )
        app = create_app(settings, score_batch=lambda texts: np.array([_score(t) for t in texts]))
        url = stack.enter_context(serve_in_thread(app))
        yield url, states, claude, app


def _score(text: str) -> float:
    head, _, tail = text.rpartition("score=")
    return float(tail.split()[0]) if head or tail[:1].isdigit() else 0.9


@pytest.fixture
def proxy(served):
    url, states, claude, app = served
    behaviours = {tier: dataclasses.replace(state.behaviour) for tier, state in states.items()}
    yield url, states, claude, app
    for tier, state in states.items():
        state.behaviour = behaviours[tier]
    claude.failure = None


@pytest.fixture
def sdk(proxy):
    with anthropic.Anthropic(base_url=proxy[0], api_key="sk-dev", max_retries=0) as client:
        yield client


def _sent(state: FakeState) -> dict:
    return state.records[-1].body


def test_a_message_is_answered_through_an_openai_upstream(sdk, proxy):
    _, states, _, app = proxy
    raw = sdk.messages.with_raw_response.create(
        model="m-large",
        max_tokens=100,
        system="Be brief.",
        messages=HI,
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20},  # fields this SDK version no longer types
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
    )
    message = raw.parse()
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "m-large" and message.stop_reason == "end_turn" and message.stop_sequence is None
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == "large " * 5
    assert message.usage.output_tokens == 5 and message.usage.input_tokens > 0
    assert message.usage.cache_read_input_tokens == 0 and message.usage.cache_creation_input_tokens == 0
    sent = _sent(states["large"])
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (sent["max_tokens"], sent["stop"], sent["user"], sent["top_k"]) == (100, ["END"], "u-1", 20)
    assert (sent["temperature"], sent["top_p"]) == (0.5, 0.9)
    assert not {"system", "stop_sequences", "metadata"} & set(sent)
    assert raw.headers["x-switchyard-model"] == "m-large"
    [record] = wait_for_records(app, 1, timeout_s=30, request_id=raw.headers["x-request-id"])
    assert (record.status, record.model, record.completion_tokens) == ("completed", "m-large", 5)


def test_max_tokens_is_the_stop_reason_of_a_cut_answer(sdk):
    message = sdk.messages.create(model="m-large", max_tokens=2, messages=HI)
    assert message.stop_reason == "max_tokens" and message.content[0].text == "large large "


def test_async_client_and_the_stream_helpers(proxy):
    url = proxy[0]

    async def run() -> tuple:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-dev", max_retries=0) as client:
            message = await client.messages.create(model="m-large", max_tokens=50, messages=HI)
            async with client.messages.stream(model="m-large", max_tokens=50, messages=HI) as stream:
                texts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
            return message, texts, final

    message, texts, final = asyncio.run(run())
    assert message.content[0].text == "large " * 5
    assert "".join(texts) == "large " * 5 and len(texts) == 5
    assert final.content[0].text == "large " * 5 and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0


def test_a_stream_has_the_documented_events_in_order(sdk):
    with sdk.messages.with_streaming_response.create(model="m-large", max_tokens=50, messages=HI, stream=True) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in raw.iter_lines() if line.startswith("event: ")]
    with sdk.messages.with_streaming_response.create(model="m-large", max_tokens=50, messages=HI, stream=True) as raw:
        events = list(raw.parse())  # the SDK's own reading of them (it drops pings)
    kinds = ["message_start", "ping", "content_block_start", *["content_block_delta"] * 5]
    kinds += ["content_block_stop", "message_delta", "message_stop"]
    assert lines == [f"event: {kind}" for kind in kinds]
    assert [event.type for event in events] == [kind for kind in kinds if kind != "ping"]
    assert events[0].message.model == "m-large" and events[0].message.id.startswith("msg_")
    delta = events[-2]
    assert delta.delta.stop_reason == "end_turn" and delta.usage.output_tokens == 5
    assert delta.usage.input_tokens > 0 and delta.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip(sdk, proxy, stream):
    _, states, _, _ = proxy
    asked = {"model": "m-large", "max_tokens": 100, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    question = {"role": "user", "content": "weather in Paris?"}
    if stream:
        with sdk.messages.stream(messages=[question], **asked) as events:
            first = events.get_final_message()
    else:
        first = sdk.messages.create(messages=[question], **asked)
    sent = _sent(states["large"])
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "The weather in a city.",
            },
        }
    ]
    assert sent["tool_choice"] == "required"
    assert first.stop_reason == "tool_use"
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    answer = sdk.messages.create(
        messages=[
            question,
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}]},
        ],
        **asked,
    )
    sent = _sent(states["large"])
    assert sent["messages"][1]["tool_calls"] == [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    ]
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}
    assert answer.stop_reason == "end_turn" and answer.content[0].text == "large " * 5


def test_image_blocks_and_cache_control_reach_the_upstream_as_content_parts(sdk, proxy):
    _, states, _, _ = proxy
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    sdk.messages.create(
        model="m-large",
        max_tokens=10,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, {"type": "image", "source": image}]}],
    )
    assert _sent(states["large"])["messages"] == [
        {
            "role": "system",
            "content": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
    ]


def test_what_a_model_cannot_do_is_a_400_naming_it(sdk, proxy):
    _, states, _, _ = proxy
    before = len(states["large"].records)
    with pytest.raises(anthropic.BadRequestError) as tools:
        sdk.messages.create(model="m-plain", max_tokens=10, messages=HI, tools=[WEATHER])
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as vision:
        sdk.messages.create(model="m-plain", max_tokens=10, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError) as server_tool:
        sdk.messages.create(
            model="m-large", max_tokens=10, messages=HI, tools=[{"type": "web_search_20250305", "name": "web_search"}]
        )
    assert len(states["large"].records) == before  # refused before any call
    for refused in (tools, vision, server_tool):
        assert refused.value.body["type"] == "error"
        assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "m-plain" in tools.value.message and "tools" in tools.value.message
    assert "vision" in vision.value.message
    assert "web_search_20250305" in server_tool.value.message


def test_an_anthropic_model_through_litellm_gets_the_blocks_natively(sdk, proxy):
    _, _, claude, _ = proxy
    system = [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}]
    message = sdk.messages.create(
        model="claude", max_tokens=50, system=system, messages=HI, extra_body={"top_k": 5}, metadata={"user_id": "u-7"}
    )
    with sdk.messages.stream(model="claude", max_tokens=50, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    first = claude.requests[-2]
    assert first["system"] == system and first["top_k"] == 5 and first["metadata"] == {"user_id": "u-7"}
    assert message.content[0].text == "bonjour from claude " and message.model == "claude"
    assert text == "bonjour from claude " and final.usage.output_tokens == 3 and final.usage.input_tokens == 12
    first_tool = sdk.messages.create(model="claude", max_tokens=50, messages=HI, tools=[WEATHER])
    [call] = first_tool.content
    assert (first_tool.stop_reason, call.type, call.input) == ("tool_use", "tool_use", {"city": "Paris"})


def test_images_and_documents_reach_an_anthropic_model_as_anthropics_own_blocks(sdk, proxy):
    _, _, claude, _ = proxy
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}
    content = [
        {"type": "text", "text": "Compare these."},
        {"type": "image", "source": png},
        {"type": "document", "source": pdf, "cache_control": {"type": "ephemeral"}},
    ]
    message = sdk.messages.create(model="claude", max_tokens=50, messages=[{"role": "user", "content": content}])
    assert message.content[-1].text == "bonjour from claude "
    [turn] = claude.requests[-1]["messages"]
    blocks = {block["type"]: block for block in turn["content"]}
    assert blocks["image"]["source"] == png
    assert blocks["document"]["source"]["media_type"] == "application/pdf"
    assert blocks["document"]["source"]["data"] == pdf["data"]
    assert blocks["document"]["cache_control"] == {"type": "ephemeral"}
    # extended thinking, which LiteLLM's map says this model lacks: a 400 naming it, before any call
    num_sent = len(claude.requests)
    with pytest.raises(anthropic.BadRequestError) as refused:
        thinking = {"type": "enabled", "budget_tokens": 1024}
        sdk.messages.create(model="claude", max_tokens=2048, messages=HI, thinking=thinking)
    assert refused.value.body["error"]["type"] == "invalid_request_error" and "thinking" in refused.value.message
    assert len(claude.requests) == num_sent


def test_prompt_caching_through_litellm_reports_and_meters_the_cache_writes_and_reads(sdk, proxy):
    """A `cache_control` breakpoint reaches Anthropic: the first request writes the prefix, the next
    (streamed) reads it; the Message's usage says so, and the ledger records both counts."""
    _, _, claude, app = proxy
    system = [{"type": "text", "text": f"Rules {uuid.uuid4().hex}.", "cache_control": {"type": "ephemeral"}}]
    wrote = sdk.messages.with_raw_response.create(model="claude", max_tokens=50, system=system, messages=HI)
    with sdk.messages.with_streaming_response.create(
        model="claude", max_tokens=50, system=system, messages=HI, stream=True
    ) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        read_id = streamed.headers["x-request-id"]
    written = wrote.parse().usage
    assert (written.cache_creation_input_tokens, written.cache_read_input_tokens) == (claude.cached_prefix_tokens, 0)
    final = [orjson.loads(e.removeprefix("data: ")) for e in events if '"message_delta"' in e][-1]["usage"]
    assert (final["cache_creation_input_tokens"], final["cache_read_input_tokens"]) == (0, claude.cached_prefix_tokens)
    assert final["input_tokens"] == written.input_tokens  # the rest of the prompt, uncached both times
    [first] = wait_for_records(app, 1, timeout_s=30, request_id=wrote.headers["x-request-id"])
    [second] = wait_for_records(app, 1, timeout_s=30, request_id=read_id)
    assert (first.cache_write_tokens, first.cache_read_tokens) == (claude.cached_prefix_tokens, 0)
    assert (second.cache_write_tokens, second.cache_read_tokens) == (0, claude.cached_prefix_tokens)


def test_errors_are_anthropics_with_their_types_and_statuses(proxy):
    url = proxy[0]

    def client(key: str | None) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)

    cases = {}
    with client("sk-unknown") as unknown:
        with pytest.raises(anthropic.AuthenticationError) as cases["authentication_error"]:
            unknown.messages.create(model="m-large", max_tokens=10, messages=HI)
    with client("sk-web") as web:
        with pytest.raises(anthropic.PermissionDeniedError) as cases["permission_error"]:
            web.messages.create(model="m-small", max_tokens=10, messages=HI)
    with client("sk-dev") as dev:
        with pytest.raises(anthropic.NotFoundError) as cases["not_found_error"]:
            dev.messages.create(model="no-such-model", max_tokens=10, messages=HI)
        with pytest.raises(anthropic.BadRequestError) as cases["invalid_request_error"]:
            dev.messages.create(model="m-large", max_tokens=10, messages=HI, extra_body={"max_tokens": None})
        with pytest.raises(anthropic.APIStatusError) as cases["request_too_large"]:
            dev.messages.create(model="m-large", max_tokens=10, messages=[{"role": "user", "content": "x" * 70_000}])
        with pytest.raises(anthropic.InternalServerError) as cases["overloaded_error"]:
            dev.messages.create(model="m-down", max_tokens=10, messages=HI)
    with client("sk-limited") as limited:
        limited.messages.create(model="m-large", max_tokens=10, messages=HI)
        with pytest.raises(anthropic.RateLimitError) as cases["rate_limit_error"]:
            limited.messages.create(model="m-large", max_tokens=10, messages=HI)
    statuses = {kind: info.value.status_code for kind, info in cases.items()}
    assert statuses == {
        "authentication_error": 401,
        "permission_error": 403,
        "not_found_error": 404,
        "invalid_request_error": 400,
        "request_too_large": 413,
        "overloaded_error": 529,
        "rate_limit_error": 429,
    }
    for kind, info in cases.items():
        body = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert "max_tokens" in cases["invalid_request_error"].value.message
    assert int(cases["rate_limit_error"].value.response.headers["retry-after"]) >= 1
    not_routed = httpx.get(url + "/v1/messages", headers={"x-api-key": "sk-dev"})
    unknown_path = httpx.post(url + "/v1/messages/batches/nope", headers={"x-api-key": "sk-dev"}, json={})
    garbage = httpx.post(url + "/v1/messages", headers={"x-api-key": "sk-dev"}, content=b"{not json")
    assert (not_routed.status_code, not_routed.json()["error"]["type"]) == (405, "invalid_request_error")
    assert (unknown_path.status_code, unknown_path.json()["error"]["type"]) == (404, "not_found_error")
    assert (garbage.status_code, garbage.json()["error"]["type"]) == (400, "invalid_request_error")
    assert httpx.post(url + "/v1/chat/completions", json={}).json()["error"]["code"] == "invalid_api_key"  # OpenAI's


def test_an_upstream_failure_after_the_first_byte_is_an_error_event(sdk, proxy):
    _, states, _, app = proxy
    states["large"].behaviour.failure, states["large"].behaviour.drop_after = "drop", 2
    with sdk.messages.with_streaming_response.create(model="m-large", max_tokens=50, messages=HI, stream=True) as raw:
        request_id = raw.headers["x-request-id"]
        lines = [line for line in raw.iter_lines() if line]
    assert lines[-2] == "event: error"
    assert '"type":"error","error":{"type":"api_error"' in lines[-1] or '"overloaded_error"' in lines[-1]
    assert "event: message_stop" not in lines
    [record] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
    assert record.status == "failed"


def test_x_api_key_and_bearer_both_authenticate_and_anthropic_headers_are_accepted(proxy):
    url = proxy[0]
    body = {"model": "m-large", "max_tokens": 10, "messages": HI}
    beta = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31,interleaved-thinking"}
    by_key = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "sk-dev"} | beta)
    by_bearer = httpx.post(url + "/v1/messages", json=body, headers={"authorization": "Bearer sk-dev"} | beta)
    neither = httpx.post(url + "/v1/messages", json=body, headers=beta)
    assert by_key.status_code == by_bearer.status_code == 200
    assert by_key.json()["type"] == "message"
    assert neither.status_code == 401 and neither.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("stream", [False, True])
def test_aliases_route_the_names_agents_send(sdk, proxy, stream):
    with sdk.messages.with_streaming_response.create(
        model="claude-3-5-haiku-20241022",
        max_tokens=50,
        messages=[{"role": "user", "content": "score=0.5"}],
        stream=stream,
        extra_headers={"x-switchyard-cascade": "off"},
    ) as raw:
        haiku = raw.headers
        body = raw.read()
    sonnet = sdk.messages.with_raw_response.create(
        model="claude-sonnet-9-0",
        max_tokens=50,
        messages=[{"role": "user", "content": "score=0.5"}],
        extra_headers={"x-switchyard-cascade": "off"},
    )
    opus = sdk.messages.with_raw_response.create(model="claude-opus-4-1", max_tokens=50, messages=HI)
    # economy's threshold (0.7) sends 0.5 to the small tier; balanced's (0.45) to the large
    assert haiku["x-switchyard-alias"] == "auto" and haiku["x-switchyard-model"] == "m-small"
    assert b"claude-3-5-haiku-20241022" in body  # the model the client asked for, echoed
    assert sonnet.headers["x-switchyard-alias"] == "auto" and sonnet.headers["x-switchyard-model"] == "m-large"
    assert opus.headers["x-switchyard-model"] == "claude" and opus.parse().model == "claude-opus-4-1"
    chat = httpx.post(
        proxy[0] + "/v1/chat/completions",
        json={"model": "claude-opus-4-1", "messages": HI},
        headers={"authorization": "Bearer sk-dev"},
    )
    assert chat.status_code == 200 and chat.headers["x-switchyard-model"] == "claude"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_and_the_cascade_answer_messages(sdk, proxy, stream):
    asked = {"max_tokens": 50, "messages": [{"role": "user", "content": "score=0.1"}], "stream": stream}
    with sdk.messages.with_streaming_response.create(model="auto", **asked) as raw:
        auto = raw.headers
        auto_body = raw.read()
    with sdk.messages.with_streaming_response.create(model="cascade", **asked) as raw:
        cascade = raw.headers
        cascade_body = raw.read()
    assert auto["x-switchyard-route"].startswith("auto:") and auto["x-switchyard-model"] in ("m-small", "m-large")
    assert auto_body
    assert cascade["x-switchyard-cascade"] and cascade["x-switchyard-model"] == "m-large"  # climbed past m-small
    assert b"large" in cascade_body and b"small" not in cascade_body


def test_count_tokens_counts_as_tokenize_does(sdk, proxy):
    url = proxy[0]
    messages = [{"role": "user", "content": "how many tokens is this?"}]
    counted = sdk.messages.count_tokens(model="m-large", messages=messages, system="Be brief.")
    tokenized = httpx.post(
        url + "/v1/tokenize",
        json={"model": "m-large", "messages": [{"role": "system", "content": "Be brief."}, *messages]},
        headers={"authorization": "Bearer sk-dev"},
    ).json()
    raw = sdk.messages.with_raw_response.count_tokens(model="claude-opus-4-1", messages=messages, tools=[WEATHER])
    assert counted.input_tokens == tokenized["count"] > 0
    assert raw.headers["x-switchyard-token-count"] == "approximate" and raw.parse().input_tokens > counted.input_tokens
    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.count_tokens(model="no-such-model", messages=messages)
    assert unknown.value.body["error"]["type"] == "not_found_error"


def test_a_streamed_message_is_metered_and_its_cost_reaches_the_budget(proxy):
    url, _, _, app = proxy
    with anthropic.Anthropic(base_url=url, api_key="sk-broke", max_retries=0) as broke:
        with broke.messages.stream(model="m-large", max_tokens=5, messages=HI) as stream:
            final = stream.get_final_message()
            request_id = stream.response.headers["x-request-id"]
        [record] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
        with pytest.raises(anthropic.RateLimitError) as spent:
            broke.messages.create(model="m-large", max_tokens=5, messages=HI)
    assert final.usage.output_tokens == 5
    assert record.status == "completed" and record.completion_tokens == 5 and record.prompt_tokens > 0
    assert record.cost_usd == pytest.approx(0.001)
    assert spent.value.body["error"]["type"] == "rate_limit_error" and "budget" in spent.value.message


def test_a_client_that_leaves_a_stream_is_metered_once(proxy):
    url, states, _, app = proxy
    # 10,000 tokens 0.05 s apart: still streaming when the client leaves, however slow the machine
    states["large"].behaviour.num_tokens, states["large"].behaviour.token_delay_s = 10_000, 0.05

    async def read_four_events_then_leave() -> str:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-dev", max_retries=0) as client:
            async with client.messages.with_streaming_response.create(
                model="m-large", max_tokens=20_000, messages=HI, stream=True
            ) as raw:
                events = aiter(await raw.parse())
                for _ in range(4):
                    await anext(events)
                return raw.headers["x-request-id"]

    request_id = asyncio.run(read_four_events_then_leave())
    record = states["large"].records[-1]
    assert wait_until(lambda: record.disconnected_at is not None, timeout_s=30)
    [metered] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
    assert metered.status == "cancelled" and 0 < metered.completion_tokens < 10_000
