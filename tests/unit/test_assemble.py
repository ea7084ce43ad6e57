"""The answer assembled from a stream's chunks is the answer the upstream would have sent whole."""

from __future__ import annotations

import pytest

from switchyard.backends.assemble import AnswerAssembler
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import BackendError

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m", "system_fingerprint": "fp"}


def _assemble(*chunks: dict) -> dict:
    assembler = AnswerAssembler("m")
    for chunk in chunks:
        assembler.add(StreamChunk.from_dict(chunk))
    return assembler.result().parsed


def _chat(*choices: dict, **extra) -> dict:
    return {**HEAD, "choices": list(choices), **extra}


def test_chat_text_logprobs_usage_and_head():
    entry = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.1}]}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    answer = _assemble(
        _chat({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}),
        _chat({"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [entry]}, "finish_reason": None}),
        _chat({"index": 0, "delta": {"content": "!"}, "logprobs": {"content": [entry]}, "finish_reason": None}),
        _chat({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}),
        _chat(usage=usage),
    )
    assert answer == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi!"},
                "logprobs": {"content": [entry, entry]},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


def test_tool_call_deltas_merge_by_index_and_content_stays_null():
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}}
    second = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}
    answer = _assemble(
        _chat({"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [first]}}),
        _chat({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}}),
        _chat({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}, second]}}),
        _chat({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
    )
    (choice,) = answer["choices"]
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
        ],
    }
    assert choice["finish_reason"] == "tool_calls" and choice["logprobs"] is None
    assert "usage" not in answer  # the upstream sent none: none is invented


def test_choices_are_kept_apart_by_index_and_unknown_fields_survive():
    answer = _assemble(
        _chat({"index": 1, "delta": {"role": "assistant", "content": "B", "reasoning_content": "think "}}),
        _chat({"index": 0, "delta": {"role": "assistant", "content": "A"}}),
        _chat({"index": 1, "delta": {"content": "b", "reasoning_content": "hard"}, "finish_reason": "length"}),
        _chat({"index": 0, "delta": {"content": "a"}, "finish_reason": "stop", "stop_reason": 42}),
    )
    first, second = answer["choices"]
    assert (first["index"], first["message"]["content"], first["finish_reason"]) == (0, "Aa", "stop")
    assert first["stop_reason"] == 42
    assert (second["index"], second["message"]["content"], second["finish_reason"]) == (1, "Bb", "length")
    assert second["message"]["reasoning_content"] == "think hard"


def test_legacy_completion_text_and_logprobs():
    head = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m"}

    def piece(text: str, offset: int, finish: str | None = None) -> dict:
        logprobs = {"tokens": [text], "token_logprobs": [-0.5], "top_logprobs": [{text: -0.5}], "text_offset": [offset]}
        return {**head, "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    answer = _assemble(piece("one", 0), piece(" two", 3, "length"))
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [
        {
            "index": 0,
            "text": "one two",
            "logprobs": {
                "tokens": ["one", " two"],
                "token_logprobs": [-0.5, -0.5],
                "top_logprobs": [{"one": -0.5}, {" two": -0.5}],
                "text_offset": [0, 3],
            },
            "finish_reason": "length",
        }
    ]


def test_an_error_event_mid_stream_is_a_backend_error():
    assembler = AnswerAssembler("m")
    assembler.add(StreamChunk.from_dict(_chat({"index": 0, "delta": {"content": "x"}})))
    with pytest.raises(BackendError, match="overloaded"):
        assembler.add(StreamChunk.from_dict({"error": {"message": "overloaded", "type": "server_error"}}))


def test_an_empty_stream_is_a_backend_error():
    with pytest.raises(BackendError, match="empty stream"):
        AnswerAssembler("m").result()


@pytest.mark.parametrize(
    "chunk",
    [
        {**HEAD, "choices": [{"index": 0, "delta": "x"}]},  # a delta that is not an object
        {**HEAD, "choices": "abc"},  # choices not a list
        {**HEAD, "choices": [None]},  # a null choice
        {**HEAD, "choices": [{"index": [0], "delta": {}}]},  # an index that is not an integer
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": {"a": 1}}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [None]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {}, "logprobs": "x"}]},
        {**HEAD, "object": "text_completion", "choices": [{"index": 0, "text": 5}]},
        {**HEAD, "usage": "many"},
        [1, 2],  # not an object at all
        {**HEAD, "error": "boom", "choices": []},  # an error, whatever else it carries
    ],
)
def test_a_malformed_chunk_is_a_backend_error_not_a_crash(chunk):
    assembler = AnswerAssembler("m")
    with pytest.raises(BackendError, match="upstream m sent"):
        assembler.add(StreamChunk.from_dict(chunk) if isinstance(chunk, dict) else StreamChunk(b"[1, 2]"))
        assembler.result()
