"""What broke in issue 16 for someone who only changed `base_url`, one test per failure, through
the `openai` SDK: (1) LiteLLM models and tools, (2) models that answered what they cannot do,
(3) errors that lost detail, (4) endpoints users reach for."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.clients.conftest import (
    API_KEY,
    CLAUDE_TEXT,
    GPT_TEXT,
    PROMPT,
    SAMPLING,
    UPSTREAM_MODEL,
    WEATHER_ARGS,
    WEATHER_TOOL,
)
from tests.conftest import closed_port
from tests.fakes.server import serve_in_thread

ASK = [{"role": "user", "content": PROMPT}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]

# -- 1. tool calls to a `backend: litellm` model ---------------------------------------------


@pytest.mark.parametrize("model", ("gpt-litellm", "claude"))
def test_tool_calls_to_a_litellm_model_answer_and_never_open_its_breaker(sdk, model):
    for _ in range(6):  # more than resilience.breaker_fail_max
        reply = sdk.chat.completions.create(model=model, messages=WEATHER, tools=[WEATHER_TOOL])
        assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == WEATHER_ARGS
    assert sdk.chat.completions.create(model=model, messages=ASK, max_tokens=12).choices[0].message.content


def test_litellm_forwards_metadata_and_extra_body(sdk, switchyard):
    sdk.chat.completions.create(
        model="gpt-litellm",
        messages=ASK,
        metadata={"ticket": "T-1"},
        extra_body={"top_k": 5, "fake": {"num_tokens": 3}},
    )
    sent = switchyard.openai_state.records[-1].body
    assert sent["metadata"] == {"ticket": "T-1"}
    assert sent["top_k"] == 5
    assert sent["fake"] == {"num_tokens": 3}


def test_litellm_refuses_what_its_provider_lacks_instead_of_dropping_it(sdk):
    with pytest.raises(openai.BadRequestError) as info:  # gpt-4o is no reasoning model
        sdk.chat.completions.create(model="gpt-litellm", messages=ASK, reasoning_effort="low")
    assert info.value.param == "reasoning_effort"


# -- 2. models that answered what they cannot do ---------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tools"),
        ({"messages": IMAGE}, "messages"),
    ],
    ids=["tools", "image"],
)
def test_the_embedded_model_refuses_what_it_cannot_do(sdk, kwargs, param):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(**{"model": "tiny", "messages": ASK, **kwargs})
    assert (info.value.code, info.value.param) == ("unsupported_parameter", param)
    assert "'tiny'" in info.value.message


def test_the_embedded_model_answers_json_schema_with_json_that_fits(sdk):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    reply = sdk.chat.completions.create(
        model="tiny",
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}},
        **{**SAMPLING, "max_tokens": 64},
    )
    answer = json.loads(reply.choices[0].message.content)
    assert answer["answer"] in ("yes", "no") and isinstance(answer["sure"], bool)


@pytest.mark.parametrize(
    "kwargs",
    [{"tools": [WEATHER_TOOL], "tool_choice": "required"}, {"messages": IMAGE}],
    ids=["tools", "image"],
)
def test_auto_does_not_route_to_a_model_that_cannot_serve_the_request(sdk, kwargs):
    raw = sdk.chat.completions.with_raw_response.create(**{"model": "auto", "messages": ASK, **kwargs})
    assert raw.headers["x-switchyard-model"] == "gpt"  # the score (0) alone would pick tiny


# -- 3. errors that lost detail ----------------------------------------------------------------


@pytest.mark.parametrize("model", ("gpt", "gpt-litellm"))
def test_the_providers_error_code_reaches_the_client(sdk, model):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=model, messages=ASK, extra_body={"fake": {"failure": "400"}})
    assert info.value.code == "content_policy_violation"
    assert "safety system" in info.value.message


def test_provider_refusals_never_open_the_breaker(sdk):
    for _ in range(6):  # more than resilience.breaker_fail_max
        with pytest.raises(openai.BadRequestError):
            sdk.chat.completions.create(model="gpt", messages=ASK, extra_body={"fake": {"failure": "400"}})
    assert sdk.chat.completions.create(model="gpt", messages=ASK).choices[0].message.content == GPT_TEXT


def test_the_answer_names_the_configured_model_and_the_upstreams_in_a_header(sdk):
    raw = sdk.chat.completions.with_raw_response.create(model="gpt", messages=ASK)
    assert raw.parse().model == "gpt"
    assert raw.headers["x-switchyard-upstream-model"] == UPSTREAM_MODEL
    chunks = list(sdk.chat.completions.create(model="gpt", messages=ASK, stream=True))
    assert {c.model for c in chunks} == {"gpt"}


# -- 4. endpoints users reach for --------------------------------------------------------------


def test_retrieve_a_model_and_its_capabilities(sdk):
    card = sdk.models.retrieve("gpt")
    assert (card.id, card.object) == ("gpt", "model")
    assert card.model_extra["capabilities"]["tools"] is True
    listed = {m.id: m.model_extra["capabilities"] for m in sdk.models.list()}
    assert set(listed) >= {"gpt", "gpt-litellm", "claude", "tiny"}
    assert listed["tiny"]["vision"] is False
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize("model", ("gpt", "claude", "auto", "cascade"))
def test_the_responses_api(sdk, model):
    response = sdk.responses.create(model=model, input=PROMPT, instructions="Be brief.", max_output_tokens=12)
    assert response.status in ("completed", "incomplete")
    assert response.output[0].type == "message"
    if model in ("gpt", "claude"):  # auto and cascade: the tiny model's text, which may be only special tokens
        assert response.output_text == {"gpt": GPT_TEXT, "claude": CLAUDE_TEXT}[model]
    assert response.usage.output_tokens > 0
    # The tiny model is cut by max_output_tokens: its stream ends in response.incomplete.
    events = list(sdk.responses.create(model=model, input=PROMPT, max_output_tokens=12, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == ("response.completed" if model in ("gpt", "claude") else "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text


@pytest.mark.parametrize(("model", "text"), [("gpt", GPT_TEXT), ("claude", CLAUDE_TEXT)])
def test_the_responses_stream_helper(sdk, model, text):
    with sdk.responses.stream(model=model, input=PROMPT, max_output_tokens=12) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == text


def test_the_responses_api_calls_tools_and_takes_their_output(sdk, switchyard):
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
    first = sdk.responses.create(model="gpt", input="What is the weather in Paris?", tools=[tool])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", WEATHER_ARGS)
    second = sdk.responses.create(
        model="gpt",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[tool],
    )
    assert second.output_text == GPT_TEXT
    sent = switchyard.openai_state.records[-1].body["messages"]
    assert (sent[-1]["role"], sent[-1]["tool_call_id"], sent[-1]["content"]) == ("tool", call.call_id, "sunny")
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_unknown_paths_and_methods_say_what_is_wrong(switchyard):
    missing = httpx.get(switchyard.url + "/v1/nope", headers={"authorization": f"Bearer {API_KEY}"})
    assert missing.status_code == 404
    assert "/v1/nope" in missing.json()["error"]["message"]
    for method in ("GET", "OPTIONS"):  # OPTIONS without CORS configured
        wrong_method = httpx.request(method, switchyard.url + "/v1/chat/completions")
        assert wrong_method.status_code == 405
        assert "POST" in wrong_method.headers["allow"]
        assert set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}


def test_a_browser_app_may_call_the_proxy_with_cors():
    settings = Settings(
        models=[{"name": "gpt", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}],
        server={"cors_origins": ["http://app.example"]},
        billing={"ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        preflight = httpx.options(
            url + "/v1/chat/completions",
            headers={
                "origin": "http://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type, x-switchyard-quality",
            },
        )
        models = httpx.get(url + "/v1/models", headers={"origin": "http://app.example"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-switchyard-quality" in preflight.headers["access-control-allow-headers"].lower()
    assert models.headers["access-control-allow-origin"] == "http://app.example"
