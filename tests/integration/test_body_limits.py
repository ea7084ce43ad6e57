"""Bodies under the byte limit that are still too much: too deep, too many messages, too long a
prompt, numbers sent as strings. Each is a 400 in OpenAI's shape, and none reaches the upstream."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from switchyard.proxy.app import create_app
from tests.conftest import proxy_settings
from tests.fakes.openai_upstream import FakeState
from tests.fakes.server import serve_in_thread

MESSAGES = [{"role": "user", "content": "hi"}]
ERROR_KEYS = {"message", "type", "param", "code"}


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def _refusal(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    assert body["error"]["type"] == "invalid_request_error"
    assert "Traceback" not in response.text
    return body["error"]


@pytest.fixture
def strict_proxy_url(fake_upstream: str) -> Iterator[str]:
    """A proxy with body limits small enough to reach in a test."""
    settings = proxy_settings(
        [{"name": "fake-small", "base_url": fake_upstream}],
        server={"max_json_depth": 16, "max_messages": 4, "max_prompt_chars": 100, "max_prompt_token_ids": 50},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1"


@pytest.mark.parametrize(
    "where",
    [
        {"unknown_field": _nested(300)},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(300)}}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "extra": _nested(300)}]}]},
    ],
    ids=["unknown field", "tool schema", "message content"],
)
def test_json_nested_300_levels_deep_is_400_not_500(proxy_url, fake_state: FakeState, where):
    """Was a 500 with a traceback: the body parsed, then could not be serialised to the upstream."""
    body = {"model": "fake-small", "messages": MESSAGES, **where}
    error = _refusal(httpx.post(proxy_url + "/chat/completions", json=body))
    assert error["code"] == "json_too_deep"
    assert "server.max_json_depth" in error["message"]
    assert error["param"] == next(iter(where))
    assert fake_state.records == []


def test_json_deeper_than_the_parser_allows_names_the_depth_limit(proxy_url):
    deep = b'{"model": "fake-small", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    error = _refusal(httpx.post(proxy_url + "/chat/completions", content=deep))
    assert error["code"] == "json_too_deep"
    assert "server.max_json_depth" in error["message"]


def test_nesting_at_the_limit_is_served_and_one_more_level_is_not(strict_proxy_url, fake_state: FakeState):
    # the body is level 1, "x" holds levels 2..16
    ok = {"model": "fake-small", "messages": MESSAGES, "x": _nested(15)}
    assert httpx.post(strict_proxy_url + "/chat/completions", json=ok).status_code == 200
    too_deep = {"model": "fake-small", "messages": MESSAGES, "x": _nested(16)}
    error = _refusal(httpx.post(strict_proxy_url + "/chat/completions", json=too_deep))
    assert error["param"] == "x"
    assert "16" in error["message"]
    assert len(fake_state.records) == 1


def test_too_many_messages_is_400_naming_the_limit(strict_proxy_url, fake_state: FakeState):
    with openai.OpenAI(base_url=strict_proxy_url, api_key="sk-test", max_retries=0) as client:
        client.chat.completions.create(model="fake-small", messages=MESSAGES * 4)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="fake-small", messages=MESSAGES * 5)
    error = info.value.response.json()["error"]
    assert error["param"] == "messages"
    assert error["code"] == "array_above_max_length"
    assert "server.max_messages" in error["message"] and "4" in error["message"]
    assert len(fake_state.records) == 1


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": "x" * 60}] * 2}, "messages"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 101}]}]},
            "messages",
        ),
        ("completions", {"prompt": "x" * 101}, "prompt"),
        ("completions", {"prompt": ["x" * 51, "y" * 50]}, "prompt"),
    ],
    ids=["chat strings", "chat text parts", "one prompt", "batch of prompts"],
)
def test_prompt_over_max_prompt_chars_is_400(strict_proxy_url, fake_state: FakeState, route, body, param):
    error = _refusal(httpx.post(f"{strict_proxy_url}/{route}", json={"model": "fake-small", **body}))
    assert error["param"] == param
    assert error["code"] == "string_above_max_length"
    assert "server.max_prompt_chars" in error["message"] and "100" in error["message"]
    assert fake_state.records == []


@pytest.mark.parametrize(
    "prompt", [list(range(51)), [list(range(30)), list(range(21))]], ids=["token ids", "batch of token ids"]
)
def test_prompt_token_ids_over_the_limit_are_400(strict_proxy_url, fake_state: FakeState, prompt):
    ok = httpx.post(strict_proxy_url + "/completions", json={"model": "fake-small", "prompt": list(range(50))})
    assert ok.status_code == 200
    response = httpx.post(strict_proxy_url + "/completions", json={"model": "fake-small", "prompt": prompt})
    error = _refusal(response)
    assert error["param"] == "prompt"
    assert error["code"] == "array_above_max_length"
    assert "server.max_prompt_token_ids" in error["message"] and "50" in error["message"]
    assert len(fake_state.records) == 1


@pytest.mark.parametrize(
    ("route", "field", "value", "expected"),
    [
        ("chat/completions", "max_tokens", "10", "an integer"),
        ("chat/completions", "max_completion_tokens", "10", "an integer"),
        ("chat/completions", "n", "2", "an integer"),
        ("chat/completions", "seed", "7", "an integer"),
        ("chat/completions", "top_logprobs", "3", "an integer"),
        ("chat/completions", "temperature", "0.5", "a number"),
        ("chat/completions", "top_p", "1", "a number"),
        ("chat/completions", "presence_penalty", "0", "a number"),
        ("chat/completions", "frequency_penalty", "0", "a number"),
        ("chat/completions", "max_tokens", 10.0, "an integer"),
        ("chat/completions", "max_tokens", True, "an integer"),
        ("chat/completions", "logprobs", "true", "a boolean"),
        ("chat/completions", "stream", "false", "a boolean"),
        ("completions", "max_tokens", "10", "an integer"),
        ("completions", "logprobs", "2", "an integer"),
        ("completions", "echo", "true", "a boolean"),
    ],
)
def test_numbers_as_strings_are_400_and_never_forwarded(
    proxy_url, fake_state: FakeState, route, field, value, expected
):
    """Was accepted (coerced for routing) and forwarded as the string; the upstream then failed."""
    body = {"model": "fake-small", field: value}
    body.update({"messages": MESSAGES} if route == "chat/completions" else {"prompt": "hi"})
    error = _refusal(httpx.post(f"{proxy_url}/{route}", json=body))
    assert error["param"] == field
    assert error["code"] == "invalid_type"
    assert f"Invalid type for '{field}': expected {expected}" in error["message"]
    assert fake_state.records == []


def test_string_logit_bias_value_is_400(proxy_url, fake_state: FakeState):
    body = {"model": "fake-small", "messages": MESSAGES, "logit_bias": {"50256": "-100"}}
    error = _refusal(httpx.post(proxy_url + "/chat/completions", json=body))
    assert error["param"] == "logit_bias.50256"
    assert error["code"] == "invalid_type"
    assert fake_state.records == []


def test_integers_for_number_fields_are_accepted_and_forwarded_as_sent(client, fake_state: FakeState):
    client.chat.completions.create(
        model="fake-small", messages=MESSAGES, temperature=1, top_p=1, presence_penalty=0, logit_bias={"1": 5}
    )
    sent = fake_state.records[0].body
    assert (sent["temperature"], sent["top_p"], sent["presence_penalty"], sent["logit_bias"]) == (1, 1, 0, {"1": 5})
