"""The Messages API's translation both ways, without a server: what the SDK tests cannot make a
fake upstream say (reasoning, cache counts, a named stop sequence, several tool calls)."""

from __future__ import annotations

import orjson
import pytest

from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import (
    BackendTimeout,
    CircuitOpen,
    InvalidRequest,
    RateLimited,
    SwitchyardError,
    UnsupportedParameter,
)
from switchyard.core.messages_wire import MessagesRequest, error_body, error_status
from switchyard.core.settings import ServerSettings
from switchyard.gateway.messages import stop_of, to_chat_request, usage_of, whole_message
from switchyard.gateway.messages_stream import MessagesShape

LIMITS = ServerSettings().body_limits()


def _request(**fields) -> MessagesRequest:
    return MessagesRequest.from_payload(
        {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]} | fields
    )


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for event in raw.split(b"\n\n"):
        if event:
            kind, data = event.split(b"\n", 1)
            out.append((kind.removeprefix(b"event: ").decode(), orjson.loads(data.removeprefix(b"data: "))))
    return out


def test_usage_splits_the_prompt_into_uncached_read_and_written_tokens():
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 60},
        "cache_creation_input_tokens": 30,
    }
    assert usage_of(usage) == {
        "input_tokens": 10,
        "output_tokens": 7,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 60,
    }
    assert usage_of(None) == dict.fromkeys(
        ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"), 0
    )


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"finish_reason": "stop"}, ("end_turn", None)),
        ({"finish_reason": "stop", "stop_reason": "END"}, ("stop_sequence", "END")),
        ({"finish_reason": "stop", "stop_reason": 2}, ("end_turn", None)),  # an end-of-sequence token id
        ({"finish_reason": "stop", "provider_specific_fields": {"stop_sequence": "END"}}, ("stop_sequence", "END")),
        ({"finish_reason": "stop", "stop_reason": "other"}, ("end_turn", None)),  # not one the client sent
        ({"finish_reason": "length"}, ("max_tokens", None)),
        ({"finish_reason": "tool_calls"}, ("tool_use", None)),
    ],
)
def test_stop_reasons(choice, expected):
    assert stop_of(choice, ["END"]) == expected


def test_tool_choice_and_parallel_calls():
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    named = to_chat_request(
        _request(tools=tools, tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True}), LIMITS
    )
    none = to_chat_request(_request(tools=tools, tool_choice={"type": "none"}), LIMITS)
    assert named.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert named.wire_payload()["parallel_tool_calls"] is False
    assert none.tool_choice == "none"
    with pytest.raises(InvalidRequest) as bad:
        to_chat_request(_request(tools=tools, tool_choice={"type": "sometimes"}), LIMITS)
    assert bad.value.param == "tool_choice"


def test_thinking_is_kept_unless_disabled_and_a_document_becomes_a_file_part():
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    enabled = to_chat_request(
        _request(thinking={"type": "enabled", "budget_tokens": 1024}, messages=[{"role": "user", "content": [pdf]}]),
        LIMITS,
    ).wire_payload()
    disabled = to_chat_request(_request(thinking={"type": "disabled"}), LIMITS).wire_payload()
    assert enabled["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert enabled["messages"][0]["content"] == [
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}}
    ]
    assert "thinking" not in disabled


@pytest.mark.parametrize(
    ("content", "param"),
    [
        ([{"type": "server_tool_use", "id": "x", "name": "web_search", "input": {}}], "messages[0].content[0].type"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}], "messages[0].content[0].source"),
    ],
)
def test_blocks_that_cannot_be_translated_are_a_400_naming_them(content, param):
    with pytest.raises(UnsupportedParameter) as refused:
        to_chat_request(_request(messages=[{"role": "user", "content": content}]), LIMITS)
    assert refused.value.param == param


def test_a_whole_answer_with_reasoning_and_tool_calls():
    completion = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "Let me look.",
                    "reasoning_content": "The user wants weather.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"c": 1}'}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4},
    }
    message = orjson.loads(whole_message(_request(model="claude-x"), orjson.dumps(completion)))
    assert message["model"] == "claude-x" and message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": ""},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_1", "name": "w", "input": {"c": 1}},
    ]
    assert message["usage"]["input_tokens"] == 9 and message["usage"]["output_tokens"] == 4


def test_a_stream_with_thinking_text_and_two_tool_calls_has_one_block_each_in_order():
    shape = MessagesShape(_request(stop_sequences=["END"]))
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x"'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
        },
    ]
    raw = b"".join(b"".join(shape.events(StreamChunk.from_dict(chunk))) for chunk in chunks) + shape.end()
    events = _events(raw)
    starts = [data["content_block"] for kind, data in events if kind == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert [(block["id"], block["name"]) for block in starts[2:]] == [("a", "f"), ("b", "g")]
    deltas = [(data["index"], data["delta"]) for kind, data in events if kind == "content_block_delta"]
    assert deltas == [
        (0, {"type": "thinking_delta", "thinking": "hmm"}),
        (1, {"type": "text_delta", "text": "ok"}),
        (2, {"type": "input_json_delta", "partial_json": '{"x"'}),
        (2, {"type": "input_json_delta", "partial_json": ": 1}"}),
        (3, {"type": "input_json_delta", "partial_json": "{}"}),
    ]
    assert [data["index"] for kind, data in events if kind == "content_block_stop"] == [0, 1, 2, 3]
    kind, delta = events[-2]
    assert kind == "message_delta" and delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 3,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }
    assert events[-1][0] == "message_stop"


def test_a_stream_that_fails_ends_with_an_error_event_and_nothing_after():
    shape = MessagesShape(_request())
    started = b"".join(shape.events(StreamChunk.from_dict({"choices": [{"index": 0, "delta": {"content": "a"}}]})))
    failed = shape.failed(SwitchyardError("boom"))
    assert shape.end() == b""
    kinds = [kind for kind, _ in _events(started + failed)]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert _events(failed)[0][1] == {"type": "error", "error": {"type": "api_error", "message": "boom"}}


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (InvalidRequest("x"), 400, "invalid_request_error"),
        (RateLimited("x"), 429, "rate_limit_error"),
        (CircuitOpen("x"), 529, "overloaded_error"),
        (BackendTimeout("x"), 504, "timeout_error"),
        (SwitchyardError("x"), 500, "api_error"),
    ],
)
def test_error_statuses_and_types(exc, status, kind):
    exc.message = "x"
    assert error_status(exc) == status
    assert orjson.loads(error_body(exc))["error"]["type"] == kind


def test_a_system_turn_among_the_messages_stays_where_it_stands():
    """Claude Code sends its per-turn context as a `role: system` message after the prompt."""
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "cwd: /x", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "plain"},
    ]
    chat = to_chat_request(_request(system="first", messages=turns), LIMITS).wire_payload()["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "system", "system"]
    assert chat[2]["content"] == [{"type": "text", "text": "cwd: /x", "cache_control": {"type": "ephemeral"}}]
    assert chat[3]["content"] == "plain"
    with pytest.raises(InvalidRequest) as refused:
        to_chat_request(_request(messages=[{"role": "system", "content": [{"type": "image"}]}]), LIMITS)
    assert refused.value.param == "messages[0].content[0]"
