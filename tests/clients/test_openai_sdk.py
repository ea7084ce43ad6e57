"""The `openai` SDK (sync, async, streaming, tools, `parse()`) against every kind of model."""

from __future__ import annotations

import json

import openai
import pytest

from tests.clients.conftest import (
    API_KEY,
    CLAUDE_TEXT,
    EVERY_MODEL,
    GPT_TEXT,
    PROMPT,
    SAMPLING,
    TOOL_RESULT_HISTORY,
    WEATHER_ARGS,
    WEATHER_TOOL,
    Verdict,
    sampling,
)

ASK = [{"role": "user", "content": PROMPT}]
ANSWERED_BY = {"gpt": "gpt", "gpt-litellm": "gpt-litellm", "claude": "claude", "tiny": "tiny", "auto": "tiny"}
ANSWERED_BY["cascade"] = "tiny"  # its first rung's answers are always accepted
TOOL_MODELS = ("gpt", "gpt-litellm", "claude")  # the upstreams that can call tools


@pytest.fixture(scope="module")
def tiny_text(sdk) -> str:
    """What the embedded model says to PROMPT, asked by name."""
    text = sdk.chat.completions.create(model="tiny", messages=ASK, **SAMPLING).choices[0].message.content
    assert text
    return text


def _expected_text(model: str, tiny_text: str) -> str:
    return {"gpt": GPT_TEXT, "gpt-litellm": GPT_TEXT, "claude": CLAUDE_TEXT}.get(model, tiny_text)


@pytest.mark.parametrize("model", EVERY_MODEL)
def test_chat_answers_and_says_who_answered(sdk, tiny_text, model):
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=ASK, **sampling(model))
    reply = raw.parse()
    assert raw.headers["x-switchyard-model"] == ANSWERED_BY[model]
    assert reply.choices[0].message.content == _expected_text(model, tiny_text)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0


@pytest.mark.parametrize("model", EVERY_MODEL)
def test_a_stream_says_what_the_answer_says(sdk, tiny_text, model):
    chunks = list(
        sdk.chat.completions.create(
            model=model, messages=ASK, **sampling(model), stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == _expected_text(model, tiny_text)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


@pytest.mark.parametrize("model", ("gpt-litellm", "claude", "tiny", "auto", "cascade"))
def test_the_answer_names_the_model_the_client_can_send_again(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, **sampling(model))
    assert reply.model == ANSWERED_BY[model]


@pytest.mark.parametrize("model", ("gpt", "claude", "auto"))
async def test_async_client_and_stream(switchyard, tiny_text, model):
    async with openai.AsyncOpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as client:
        reply = await client.chat.completions.create(model=model, messages=ASK, **sampling(model))
        stream = await client.chat.completions.create(model=model, messages=ASK, **sampling(model), stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert reply.choices[0].message.content == text == _expected_text(model, tiny_text)


# -- tools -------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_tool_calls(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == WEATHER_ARGS


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_streamed_tool_call_deltas_reassemble(sdk, model):
    chunks = [
        c
        for c in sdk.chat.completions.create(
            model=model, messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL], tool_choice="required", stream=True
        )
        if c.choices
    ]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert {d.index for d in deltas} == {0}
    assert [d.function.name for d in deltas if d.function and d.function.name] == ["get_weather"]
    assert json.loads("".join(d.function.arguments or "" for d in deltas if d.function)) == WEATHER_ARGS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_a_tool_result_round_trip_reaches_the_provider(sdk, switchyard, model):
    reply = sdk.chat.completions.create(model=model, messages=TOOL_RESULT_HISTORY, tools=[WEATHER_TOOL])
    assert reply.choices[0].message.content == (CLAUDE_TEXT if model == "claude" else GPT_TEXT)
    if model == "claude":
        sent = switchyard.anthropic_state.requests[-1]["messages"]
        assert sent[-2]["content"][-1]["type"] == "tool_use"
        assert sent[-1]["content"][0] | {"content": None} == {
            "type": "tool_result",
            "tool_use_id": "call_1",
            "content": None,
        }
    else:
        sent = switchyard.openai_state.records[-1].body["messages"]
        assert sent[-2]["tool_calls"][0]["id"] == "call_1"
        assert sent[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}


@pytest.mark.parametrize("model", ("auto", "cascade"))
def test_auto_and_cascade_pass_tools_to_a_model_that_can_call_them(sdk, model):
    raw = sdk.chat.completions.with_raw_response.create(
        model=model, messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert raw.headers["x-switchyard-model"] == "gpt"
    explained = raw.headers.get("x-switchyard-route", "") + raw.headers.get("x-switchyard-cascade", "")
    assert "tools" in explained  # the route says a capability decided it
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tools_to_a_model_whose_template_cannot_render_them_are_a_400(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER_TOOL], tool_choice="required")
    assert (info.value.code, info.value.param) == ("unsupported_parameter", "tools")
    assert "tiny" in info.value.message and "tools" in info.value.message


# -- structured output -------------------------------------------------------------------------


@pytest.mark.parametrize("model", ("gpt", "gpt-litellm", "claude"))
def test_parse_into_a_pydantic_model(sdk, model):
    reply = sdk.chat.completions.parse(model=model, messages=ASK, response_format=Verdict)
    assert reply.choices[0].message.parsed == Verdict(answer="yes", sure=True)


@pytest.mark.parametrize("model", ("gpt", "claude"))
def test_beta_parse_and_the_structured_stream_helper(sdk, model):
    assert sdk.beta.chat.completions.parse(model=model, messages=ASK, response_format=Verdict).choices[
        0
    ].message.parsed == Verdict(answer="yes", sure=True)
    with sdk.chat.completions.stream(model=model, messages=ASK, response_format=Verdict) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "content.done" in kinds
    assert final.choices[0].message.parsed == Verdict(answer="yes", sure=True)


@pytest.mark.parametrize("model", ("tiny", "auto", "cascade"))
def test_parse_on_the_embedded_model_is_constrained_to_the_schema(sdk, model):
    reply = sdk.chat.completions.parse(model=model, messages=ASK, response_format=Verdict, max_tokens=64)
    assert isinstance(reply.choices[0].message.parsed, Verdict)


@pytest.mark.parametrize("model", ("gpt", "gpt-litellm"))
def test_json_object_mode(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_json_object_mode_on_the_embedded_model(sdk):
    reply = sdk.chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "json_object"}, max_tokens=64
    )
    if reply.choices[0].finish_reason == "stop":  # cut by max_tokens, the JSON may be incomplete
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    assert reply.choices[0].message.content.lstrip().startswith("{")


def test_auto_routes_by_the_classifiers_score(sdk):
    high = sdk.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "score=0.9"}]
    )
    assert high.headers["x-switchyard-model"] == "gpt"
    assert high.headers["x-switchyard-route"] == "auto:classifier=0.900>=0.500->large"
    assert high.parse().choices[0].message.content == GPT_TEXT
