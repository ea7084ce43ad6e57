"""Tools on the embedded engine: the history rendered into the prompt, forced-call schemas, parsing."""

from __future__ import annotations

import json

import pytest

from switchyard.backends.embedded import openai_format as fmt
from switchyard.backends.embedded import tool_calls
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import InvalidRequest
from tests.tiny_model import TOOLS_CHAT_TEMPLATE

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ROUND_TRIP = [
    {"role": "user", "content": "weather in paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


@pytest.fixture
def tools_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
    return tokenizer


def _request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": ROUND_TRIP, **fields})


def test_tool_calls_and_results_in_the_history_reach_the_prompt(tools_tokenizer):
    prompt_ids = fmt.chat_prompt_ids(tools_tokenizer, _request(tools=[WEATHER]))
    prompt = tools_tokenizer.decode(prompt_ids)
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "paris"}}</tool_call>' in prompt
    assert "<tool_response id=call_1>sunny, 21 C</tool_response>" in prompt
    assert '"name": "get_weather"' in prompt.split("<|end|>")[0]  # the tools, before the messages
    assert prompt.endswith("<|assistant|>")


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tools_tokenizer):
    prompt = fmt.chat_prompt(tools_tokenizer, _request(tools=[WEATHER], tool_choice="none"))
    assert "You may call these tools" not in prompt
    assert "sunny, 21 C" in prompt


def test_which_templates_render_tools(tiny_model, tools_tokenizer):
    _, plain = tiny_model
    assert not tool_calls.renders_tools(plain)
    assert tool_calls.renders_tools(tools_tokenizer)


def test_a_forced_call_is_decoded_under_its_functions_schema():
    named = tool_calls.call_schema(
        _request(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    )
    assert named["properties"]["name"] == {"type": "string", "enum": ["get_time"]}
    required = tool_calls.call_schema(_request(tools=[WEATHER, TIME], tool_choice="required"))
    assert [s["properties"]["name"]["enum"] for s in required["anyOf"]] == [["get_weather"], ["get_time"]]
    assert required["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    assert tool_calls.call_schema(_request(tools=[WEATHER], tool_choice="auto")) is None
    with pytest.raises(InvalidRequest) as info:
        tool_calls.call_schema(
            _request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
        )
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "rome"}}',
        '<tool_call>{"name": "get_weather", "parameters": {"city": "rome"}}</tool_call>',
        '[{"name": "get_weather", "arguments": {"city": "rome"}}]',
        '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "rome"}\n}\n```',
        '```\n{"name": "get_weather", "arguments": {"city": "rome"}}```',
    ],
)
def test_an_answer_that_is_a_call_becomes_tool_calls(text):
    calls = tool_calls.parse_tool_calls(text, _request(tools=[WEATHER]))
    assert len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "rome"}


@pytest.mark.parametrize(
    "text",
    [
        "the weather is fine",
        '{"name": "unknown_tool", "arguments": {}}',
        '{"name": "get_weather", "arguments": "x"}',
        'Here it is:\n```json\n{"name": "get_weather", "arguments": {"city": "rome"}}\n```',
    ],
)
def test_an_answer_that_is_not_a_call_stays_text(text):
    assert tool_calls.parse_tool_calls(text, _request(tools=[WEATHER])) == []
