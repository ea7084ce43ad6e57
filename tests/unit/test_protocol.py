from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from switchyard.core.protocol import ChatCompletionRequest, CompletionResult, StreamChunk


def test_wire_payload_is_what_the_client_sent_unknown_fields_included():
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "guided_json": {"type": "object"}}
    request = ChatCompletionRequest.from_payload(payload)
    assert request.wire_payload() == payload
    wire = request.wire_payload()
    wire["model"] = "upstream-name"
    assert payload["model"] == "m"


def test_wire_payload_without_a_source_dumps_only_set_fields():
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.5)
    assert request.wire_payload() == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    }


def test_field_limits_are_enforced():
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], top_logprobs=21)


def test_stream_chunk_is_parsed_only_when_read():
    chunk = StreamChunk(b'{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}')
    assert chunk._parsed is None
    assert chunk.text() == "Hi"
    assert not chunk.has_usage
    usage = StreamChunk(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1}}))
    assert usage.has_usage and not usage.has_choices


def test_completion_result_shape_check_and_typed_view():
    good = CompletionResult(b'{"id": "x", "model": "m", "choices": [{"index": 0, "message": {"content": "ok"}}]}')
    assert good.looks_like_completion()
    assert good.as_chat_completion().choices[0].message.content == "ok"
    assert not CompletionResult(b"<html>oops</html>").looks_like_completion()
    assert not CompletionResult(b'{"error": "x"}').looks_like_completion()
