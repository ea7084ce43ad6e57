"""The Responses API translated to a chat request, and a chat stream translated to Responses events."""

from __future__ import annotations

import orjson
import pytest

from switchyard.core.body_limits import BodyLimits
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import ArrayTooLong, InvalidRequest, UnsupportedParameter
from switchyard.core.responses_wire import ResponsesRequest
from switchyard.gateway.responses import draft_for, message_item, responses_param, to_chat_request
from switchyard.gateway.responses_stream import ResponsesShape

LIMITS = BodyLimits(max_json_depth=64, max_messages=8, max_prompt_chars=10_000, max_prompt_token_ids=100)


def _chat(**body):
    return to_chat_request(ResponsesRequest.from_payload({"model": "m"} | body), LIMITS).wire_payload()


def test_calls_made_in_one_turn_become_one_assistant_message_after_its_text():
    messages = _chat(
        input=[
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "21C"}]},
        ]
    )["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Checking."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "21C"}


def test_text_format_text_adds_no_response_format_and_reasoning_effort_is_kept():
    chat = _chat(input="hi", text={"format": {"type": "text"}, "verbosity": "low"}, reasoning={"effort": "low"})
    assert "response_format" not in chat and "text" not in chat and "reasoning" not in chat
    assert (chat["verbosity"], chat["reasoning_effort"]) == ("low", "low")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
    ],
)
def test_what_cannot_be_served_names_its_parameter(body, param):
    with pytest.raises(UnsupportedParameter) as info:
        _chat(**{"input": "hi"} | body)
    assert info.value.param == param


def test_an_image_by_file_id_is_refused_naming_the_part():
    with pytest.raises(InvalidRequest) as info:
        _chat(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}])
    assert info.value.param == "input[0].content[0]" and "file_id" in info.value.message


def test_the_body_limits_hold_for_the_messages_the_input_becomes():
    with pytest.raises(ArrayTooLong) as info:
        _chat(input=[{"role": "user", "content": "x"}] * 9)
    assert info.value.param == "input"


def _events(shape: ResponsesShape, *chunks: dict) -> list[dict]:
    raw = b"".join(event for chunk in chunks for event in shape.events(StreamChunk.from_dict(chunk))) + shape.end()
    events = []
    for block in raw.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        event = orjson.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def _delta(delta: dict, finish_reason: str | None = None) -> dict:
    return {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def test_text_then_parallel_calls_are_items_in_order_each_closed_before_the_next():
    shape = ResponsesShape(draft_for(ResponsesRequest.from_payload({"model": "m", "input": "hi"})))
    call = {"type": "function", "function": {"name": "w", "arguments": ""}}
    events = _events(
        shape,
        _delta({"role": "assistant", "content": "Let me check."}),
        _delta({"tool_calls": [{"index": 0, "id": "c1", **call}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]}),
        _delta({"tool_calls": [{"index": 1, "id": "c2", **call}]}),
        _delta({"tool_calls": [{"index": 1, "function": {"arguments": '{"a":2}'}}]}),
        _delta({}, "tool_calls"),
        {"model": "m", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}},
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    items = [(e["type"], e["output_index"]) for e in events if e["type"].startswith("response.output_item")]
    assert items == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.output_item.done", 2),
    ]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["name"], e["arguments"]) for e in done] == [("w", '{"a":1}'), ("w", '{"a":2}')]
    final = events[-1]
    assert final["type"] == "response.completed"
    output = final["response"]["output"]
    assert output[0]["content"][0]["text"] == "Let me check."
    assert [(o["type"], o.get("call_id"), o["status"]) for o in output] == [
        ("message", None, "completed"),
        ("function_call", "c1", "completed"),
        ("function_call", "c2", "completed"),
    ]
    assert final["response"]["usage"]["input_tokens"] == 4 and final["response"]["usage"]["total_tokens"] == 13


def test_a_stream_cut_by_the_token_limit_ends_incomplete():
    shape = ResponsesShape(draft_for(ResponsesRequest.from_payload({"model": "m", "input": "hi"})))
    events = _events(shape, _delta({"content": "a"}), _delta({}, "length"))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_a_streamed_refusal_is_its_own_part_with_its_events_as_when_not_streamed():
    shape = ResponsesShape(draft_for(ResponsesRequest.from_payload({"model": "m", "input": "hi"})))
    events = _events(shape, _delta({"role": "assistant", "refusal": "I can"}), _delta({"refusal": "not."}, "stop"))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3]["part"] == {"type": "refusal", "refusal": ""}
    assert events[6]["refusal"] == "I cannot." and events[6]["content_index"] == 0
    streamed = events[-1]["response"]["output"][0]
    assert streamed["content"] == message_item(streamed["id"], "", refusal="I cannot.")["content"]


@pytest.mark.parametrize(
    ("chat_param", "param"),
    [
        ("response_format", "text.format"),
        ("max_completion_tokens", "max_output_tokens"),
        ("messages[3].content[1]", "input"),
        ("tools", "tools"),
        (None, None),
    ],
)
def test_a_refusal_of_the_chat_request_names_what_the_client_sent(chat_param, param):
    assert responses_param(chat_param) == param
