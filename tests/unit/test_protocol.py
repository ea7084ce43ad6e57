from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk


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


def test_a_legacy_completion_chunk_has_its_text():
    chunk = StreamChunk(b'{"object": "text_completion", "choices": [{"index": 0, "text": "Hello"}]}')
    assert chunk.text() == "Hello"


def test_completion_result_shape_check_and_typed_view():
    good = CompletionResult(b'{"id": "x", "model": "m", "choices": [{"index": 0, "message": {"content": "ok"}}]}')
    assert good.looks_like_completion()
    assert good.as_chat_completion().choices[0].message.content == "ok"
    assert not CompletionResult(b"<html>oops</html>").looks_like_completion()
    assert not CompletionResult(b'{"error": "x"}').looks_like_completion()


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        ({"id": "x", "model": "vendor/big-v2", "choices": []}, "vendor/big-v2"),
        # a "model" inside a string is escaped: only the real key is renamed
        ({"choices": [{"delta": {"content": '{"model": "no"}'}}], "model": 'odd"name'}, 'odd"name'),
        ({"model": None, "choices": []}, None),
    ],
)
def test_named_puts_the_configured_name_in_place_of_the_upstreams(upstream, expected):
    for data in (orjson.dumps(upstream), orjson.dumps(upstream, option=orjson.OPT_INDENT_2)):
        named = StreamChunk(data).named("small")
        assert named.upstream_model == expected
        assert orjson.loads(named.data) == {**upstream, "model": "small"}
        assert named.parsed["model"] == "small"


def test_named_leaves_what_has_no_model_or_the_same_name():
    error = StreamChunk(b'{"error": {"message": "x"}}')
    assert error.named("small").data == error.data
    same = CompletionResult(b'{"model":"small","choices":[]}').named("small")
    assert same.data == b'{"model":"small","choices":[]}' and same.upstream_model == "small"
    chunk = StreamChunk(b'{"model":"small","choices":[]}')
    assert chunk.named("small") is chunk  # the common case builds nothing
    escaped = StreamChunk(b'{"model":"sm\\u0061ll","choices":[]}')  # the same name, spelled otherwise
    assert escaped.named("small") is escaped and escaped.upstream_model == "small"


def test_the_same_upstream_name_chunk_after_chunk_is_renamed_every_time():
    for _ in range(3):
        named = StreamChunk(b'{"model":"vendor/big","choices":[{"delta":{"content":"x"}}]}').named("small")
        assert named.data == b'{"model":"small","choices":[{"delta":{"content":"x"}}]}'
        assert named.upstream_model == "vendor/big"
