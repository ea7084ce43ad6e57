"""Tools through the LiteLLM backend, against fake OpenAI and Anthropic servers speaking each
provider's own tool wire format; the client is the `openai` SDK."""

from __future__ import annotations

import json

import pytest

from tests.integration.commercial_proxy import commercial_proxy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def proxy():
    with commercial_proxy() as proxy:
        yield proxy


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_a_tool_call(proxy, model):
    reply = proxy.sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=50)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id
    sent = proxy.last_sent(model)
    names = [t.get("name") or t["function"]["name"] for t in sent["tools"]]
    assert names == ["get_weather"]


def _reassembled(stream) -> tuple[dict[int, dict], list[str], int]:
    """The tool calls of a stream put together by index, as an agent framework does."""
    calls: dict[int, dict] = {}
    finish_reasons = []
    num_argument_fragments = 0
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = call["id"] or delta.id
                call["name"] += (delta.function.name or "") if delta.function else ""
                fragment = (delta.function.arguments or "") if delta.function else ""
                num_argument_fragments += bool(fragment)
                call["arguments"] += fragment
    return calls, finish_reasons, num_argument_fragments


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_streamed_tool_call_deltas_reassemble(proxy, model):
    stream = proxy.sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=50, stream=True)
    calls, finish_reasons, num_argument_fragments = _reassembled(stream)
    assert list(calls) == [0]
    assert calls[0]["id"] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert num_argument_fragments > 1  # really streamed, not one piece
    assert finish_reasons == ["tool_calls"]


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_parallel_tool_calls_stream_apart_by_index(proxy, model):
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    proxy.gpt.behaviour.num_tool_calls = proxy.claude.num_tool_calls = 2
    try:
        stream = proxy.sdk.chat.completions.create(
            model=model, messages=ASK, tools=[WEATHER, time_tool], max_tokens=50, stream=True
        )
        calls, finish_reasons, _ = _reassembled(stream)
    finally:
        proxy.gpt.behaviour.num_tool_calls = proxy.claude.num_tool_calls = 1
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert len({call["id"] for call in calls.values()}) == 2
    assert all(json.loads(call["arguments"]) == {"city": "Paris"} for call in calls.values())
    assert finish_reasons == ["tool_calls"]


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_a_tool_result_round_trip(proxy, model):
    sdk = proxy.sdk
    first = sdk.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=50)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = sdk.chat.completions.create(model=model, messages=history, tools=[WEATHER], max_tokens=50)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content
    sent = proxy.last_sent(model)
    if model == "gpt":
        assistant, tool = sent["messages"][-2:]
        assert assistant["tool_calls"][0]["id"] == call.id
        assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
        assert tool == {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}
    else:
        assistant, user = sent["messages"][-2:]
        (tool_use,) = [b for b in assistant["content"] if b["type"] == "tool_use"]
        assert (tool_use["id"], tool_use["name"], tool_use["input"]) == (call.id, "get_weather", {"city": "Paris"})
        (result,) = [b for b in user["content"] if b["type"] == "tool_result"]
        assert result["tool_use_id"] == call.id
        assert "18 C and sunny" in json.dumps(result["content"])
