"""Limits beyond bytes, strict wire types, and where a body is parsed (loop or worker thread)."""

from __future__ import annotations

import gc
import threading
from types import SimpleNamespace

import orjson
import pytest
from pydantic import ValidationError, model_validator
from starlette.requests import Request

from switchyard.core.body_limits import BodyLimits, check_body_limits
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.errors import ArrayTooLong, InvalidRequest, InvalidType, JSONTooDeep, PromptTooLong
from switchyard.core.settings import ServerSettings, Settings
from switchyard.gateway.parsing import OFF_LOOP_BYTES, _CollectorPause, parse_request
from switchyard.proxy.body import read_request

LIMITS = BodyLimits(max_json_depth=8, max_messages=3, max_prompt_chars=20, max_prompt_token_ids=10)
HI = [{"role": "user", "content": "hi"}]


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _chat(**fields) -> dict:
    return {"model": "m", "messages": HI, **fields}


def test_defaults_are_documented_values():
    server = ServerSettings()
    assert server.body_limits() == BodyLimits(
        max_json_depth=64, max_messages=2048, max_prompt_chars=2_000_000, max_prompt_token_ids=262_144
    )


def test_max_json_depth_stays_below_what_orjson_can_write_back():
    with pytest.raises(ValidationError):
        ServerSettings(max_json_depth=254)


def test_depth_counts_the_body_as_level_one():
    check_body_limits(_chat(x=_nested(7)), LIMITS)  # levels 2..8
    with pytest.raises(JSONTooDeep) as info:
        check_body_limits(_chat(x=_nested(8)), LIMITS)
    assert info.value.param == "x"
    assert "server.max_json_depth" in info.value.message


def test_brackets_inside_strings_are_not_nesting():
    payload = _chat(x="[" * 1000, messages=[{"role": "user", "content": "{" * 20}])
    check_body_limits(payload, LIMITS)
    request = parse_request(ChatCompletionRequest, orjson.dumps(payload), LIMITS)  # the parser's depth limit too
    assert request.model_extra == {"x": "[" * 1000}
    assert request.messages[0].content == "{" * 20


def test_a_deep_branch_beside_shallow_ones_is_found():
    wide = [{"a": 1}] * 1000 + [_nested(10)]
    with pytest.raises(JSONTooDeep):
        check_body_limits(_chat(tools=wide), LIMITS)


def test_too_many_messages():
    with pytest.raises(ArrayTooLong) as info:
        check_body_limits({"messages": HI * 4}, LIMITS)
    assert info.value.param == "messages"
    assert "4 messages" in info.value.message and "server.max_messages" in info.value.message


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"messages": [{"role": "user", "content": "x" * 21}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x" * 10}, {"role": "user", "content": "y" * 11}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 21}]}]}, "messages"),
        ({"prompt": "x" * 21}, "prompt"),
        ({"prompt": ["x" * 10, "y" * 11]}, "prompt"),
    ],
)
def test_prompt_chars_are_counted_across_messages_and_parts(payload, param):
    with pytest.raises(PromptTooLong) as info:
        check_body_limits(payload, LIMITS)
    assert info.value.param == param
    assert "21 characters" in info.value.message and "server.max_prompt_chars" in info.value.message


@pytest.mark.parametrize("prompt", [list(range(11)), [list(range(5)), list(range(6))]])
def test_prompt_token_ids_are_counted_across_a_batch(prompt):
    check_body_limits({"prompt": list(range(10))}, LIMITS)
    with pytest.raises(ArrayTooLong) as info:
        check_body_limits({"prompt": prompt}, LIMITS)
    assert info.value.param == "prompt"
    assert "11 token ids" in info.value.message and "server.max_prompt_token_ids" in info.value.message


@pytest.mark.parametrize(
    ("model", "payload", "param"),
    [
        (ChatCompletionRequest, {"messages": "not a list"}, "messages"),
        (CompletionRequest, {"prompt": 5}, "prompt"),
        (ChatCompletionRequest, {"messages": [5, {"content": 7}, {"content": [3, {"text": 4}]}]}, "messages[0]"),
    ],
)
def test_wrong_shapes_are_left_to_validation(model, payload, param):
    check_body_limits(payload, LIMITS)  # no limit error for a shape it cannot measure ...
    with pytest.raises(InvalidType) as info:  # ... validation names the field instead
        parse_request(model, orjson.dumps({"model": "m", **payload}), LIMITS)
    assert info.value.param == param


def test_parser_depth_limit_becomes_the_nesting_error():
    with pytest.raises(JSONTooDeep) as info:
        parse_request(ChatCompletionRequest, b"[" * 2000 + b"]" * 2000, LIMITS)
    assert info.value.status_code == 400


def test_limits_apply_before_validation():
    """A body over a limit is refused for that, whatever else is wrong with it."""
    body = orjson.dumps({"messages": HI * 4, "temperature": "hot"})
    with pytest.raises(ArrayTooLong):
        parse_request(ChatCompletionRequest, body, LIMITS)


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": "10"}, "max_tokens", "Invalid type for 'max_tokens': expected an integer, but got a string"),
        ({"n": 2.0}, "n", "expected an integer, but got a decimal number"),
        ({"seed": False}, "seed", "expected an integer, but got a boolean"),
        ({"temperature": "0.2"}, "temperature", "expected a number, but got a string"),
        ({"stream": 1}, "stream", "expected a boolean, but got an integer"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "expected a boolean"),
        ({"stop": 5}, "stop", "expected a string, but got an integer"),
    ],
)
def test_wrong_types_are_invalid_type_naming_the_param(fields, param, message):
    with pytest.raises(InvalidType) as info:
        parse_request(ChatCompletionRequest, orjson.dumps(_chat(**fields)), LIMITS)
    assert info.value.param == param
    assert info.value.code == "invalid_type"
    assert message in info.value.message


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        (5, "prompt"),
        (["a", 1], "prompt[1]"),
        ([1, "a"], "prompt[1]"),
        ([[1, "x"]], "prompt[0][1]"),
        ([1.5], "prompt[0]"),
    ],
)
def test_a_prompt_of_mixed_forms_names_the_bad_item(prompt, param):
    with pytest.raises(InvalidType) as info:
        parse_request(CompletionRequest, orjson.dumps({"model": "m", "prompt": prompt}), LIMITS)
    assert info.value.param == param


def test_ints_are_numbers_and_pass_as_sent():
    request = parse_request(ChatCompletionRequest, orjson.dumps(_chat(temperature=1, top_p=0)), LIMITS)
    assert request.temperature == 1.0
    assert request.wire_payload()["temperature"] == 1


def test_missing_and_out_of_range_keep_their_codes():
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, b'{"model": "m"}', LIMITS)
    assert info.value.code == "missing_required_parameter"
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, orjson.dumps(_chat(max_tokens=0)), LIMITS)
    assert info.value.code == "invalid_value"


# --- where the body is parsed -----------------------------------------------------------------

_PARSED_ON: list[tuple[threading.Thread, bool]] = []  # the thread, and whether the collector ran


class _Recorded(ChatCompletionRequest):
    @model_validator(mode="after")
    def _record_thread(self) -> _Recorded:
        _PARSED_ON.append((threading.current_thread(), gc.isenabled()))
        return self


def _request(body: bytes) -> Request:
    app = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(settings=Settings())))
    scope = {"type": "http", "method": "POST", "headers": [(b"content-length", str(len(body)).encode())], "app": app}
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return chunks.pop(0)

    return Request(scope, receive)


@pytest.mark.parametrize(
    ("num_messages", "is_on_loop"), [(1, True), (OFF_LOOP_BYTES // 100, False)], ids=["small", "large"]
)
async def test_large_bodies_are_parsed_off_the_event_loop(num_messages, is_on_loop):
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 20}] * num_messages})
    assert (len(body) < OFF_LOOP_BYTES) == is_on_loop
    _PARSED_ON.clear()
    request = await read_request(_request(body), _Recorded, Settings().server)
    assert len(request.messages) == num_messages
    [(thread, was_collecting)] = _PARSED_ON
    assert (thread is threading.current_thread()) == is_on_loop
    assert was_collecting == is_on_loop  # the collector is paused while a large body is parsed
    assert gc.isenabled()


def test_the_collector_is_back_when_the_last_overlapping_parse_ends():
    pause = _CollectorPause()
    with pause.paused():
        with pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled():
    pause = _CollectorPause()
    gc.disable()
    try:
        with pause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
