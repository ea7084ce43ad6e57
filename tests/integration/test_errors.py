"""Bad input and failing upstreams reach the `openai` SDK as its own exception classes."""

from __future__ import annotations

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30  # bounds a hang only: a request the upstream answers, on a busy machine
ERROR_KEYS = {"message", "type", "param", "code"}


def _error(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == ERROR_KEYS
    return body["error"]


def test_malformed_json_is_400(proxy_url):
    response = httpx.post(
        proxy_url + "/chat/completions",
        content=b'{"model": "fake-small", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["type"] == "invalid_request_error"
    assert "could not parse the JSON body" in error["message"]
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"]


def test_non_object_body_is_400(proxy_url):
    response = httpx.post(proxy_url + "/chat/completions", content=b"[1, 2]")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The request body must be a JSON object."


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": MESSAGES, "temperature": 5}, "temperature"),
        ({"messages": MESSAGES, "top_logprobs": 30, "logprobs": True}, "top_logprobs"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ],
)
def test_schema_violations_are_400_with_param(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fake-small", **kwargs)
    assert info.value.status_code == 400
    error = _error(info.value)
    assert error["param"] == param
    assert param in error["message"]


def test_missing_messages_names_the_param(proxy_url):
    response = httpx.post(proxy_url + "/chat/completions", json={"model": "fake-small"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages"
    assert error["code"] == "missing_required_parameter"


def test_unknown_model_is_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-99", messages=MESSAGES)
    error = _error(info.value)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert "gpt-99" in error["message"]


def test_body_over_the_limit_is_413(client):
    huge = [{"role": "user", "content": "x" * (70 * 1024)}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="fake-small", messages=huge)
    assert info.value.status_code == 413
    assert _error(info.value)["code"] == "request_too_large"


def test_unknown_route_is_openai_shaped_404(proxy_url):
    response = httpx.get(proxy_url + "/nope")
    assert response.status_code == 404
    assert set(response.json()["error"]) == ERROR_KEYS


def test_upstream_500_is_502_with_the_upstream_reason(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="fake-small", messages=MESSAGES, extra_body={"fake": {"failure": "500"}})
    assert info.value.status_code == 502
    error = _error(info.value)
    assert error["code"] == "upstream_error"
    assert "broke on purpose" in error["message"]


def test_upstream_429_is_429_with_retry_after(client):
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(
            model="fake-small", messages=MESSAGES, extra_body={"fake": {"failure": "429", "retry_after_s": 7}}
        )
    assert info.value.response.headers["retry-after"] == "7"
    assert "Rate limit reached" in _error(info.value)["message"]


def test_upstream_unreachable_is_503(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="fake-down", messages=MESSAGES)
    assert info.value.status_code == 503
    assert _error(info.value)["code"] == "upstream_unavailable"


def test_upstream_hang_is_504(client, fake_state):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model="fake-impatient", messages=MESSAGES, extra_body={"fake": {"failure": "hang"}}
        )
    assert info.value.status_code == 504
    assert _error(info.value)["code"] == "upstream_timeout"


def test_stream_error_before_first_byte_is_a_real_status(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model="fake-small", messages=MESSAGES, stream=True, extra_body={"fake": {"failure": "500"}}
        )
    assert info.value.status_code == 502


@pytest.mark.parametrize("failure", ["drop", "malformed"])
def test_stream_error_after_first_byte_goes_in_band(proxy_url, failure):
    with httpx.stream(
        "POST",
        proxy_url + "/chat/completions",
        json={"model": "fake-small", "messages": MESSAGES, "stream": True, "fake": {"failure": failure}},
        timeout=TIMEOUT_S,
    ) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    error = httpx.Response(200, content=events[-2].removeprefix("data: ")).json()["error"]
    assert set(error) == ERROR_KEYS
    assert error["code"] in ("upstream_error", "upstream_unavailable")
    assert events[0].startswith("data: {")


def test_sdk_raises_on_in_band_error(client):
    stream = client.chat.completions.create(
        model="fake-small",
        messages=MESSAGES,
        stream=True,
        extra_body={"fake": {"failure": "drop", "drop_after": 2}},
    )
    received = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content)
    assert received == ["alpha ", "bravo "]


def test_a_trailing_slash_is_served_not_redirected(proxy_url):
    body = {"model": "fake-small", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(proxy_url + "/chat/completions/", json=body, timeout=TIMEOUT_S)
    models = httpx.get(proxy_url + "/models/")
    live = httpx.get(proxy_url.removesuffix("/v1") + "/health/live/")
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    assert models.status_code == 200 and models.json()["data"]
    assert live.status_code == 200
