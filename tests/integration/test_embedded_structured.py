"""JSON modes, tools and refusals on the embedded engine, through the proxy and the real `openai` SDK.

Two tiny random models: `tiny` has a chat template without tools, `tiny-tools` one that renders them.
A random model writes garbage, so whatever is valid here is the constrained decoding's doing.
"""

from __future__ import annotations

import copy
import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import TOOLS_CHAT_TEMPLATE, build_tiny_model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
# Nested objects, an array of objects, enums, booleans, null. Numbers are enums: a random model would
# otherwise write one digit after another until max_tokens (SmolLM2 writes free ones: test_smollm2.py).
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "enum": [20, 30, 40]},
        "member": {"type": "boolean"},
        "nickname": {"type": "null"},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["paris", "rome"]},
                "geo": {
                    "type": "object",
                    "properties": {"north": {"type": "boolean"}, "label": {"type": "string"}},
                    "required": ["north", "label"],
                },
            },
            "required": ["city", "geo"],
        },
        "pets": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {"kind": {"type": "string", "enum": ["cat", "dog"]}, "vaccinated": {"type": "boolean"}},
                "required": ["kind", "vaccinated"],
            },
        },
    },
    "required": ["name", "age", "member", "nickname", "address", "pets"],
}
# Sampled, a random model's free strings run for hundreds of tokens: there the strings are enums.
PERSON_OF_ENUMS = copy.deepcopy(PERSON)
PERSON_OF_ENUMS["properties"]["name"] = {"type": "string", "enum": ["ann", "bob"]}
PERSON_OF_ENUMS["properties"]["address"]["properties"]["geo"]["properties"]["label"] = {"enum": ["n", "s"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["paris", "rome"]},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "enum": [1, 2, 3]},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module")
def embedded_proxy(tmp_path_factory):
    plain = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    tools = build_tiny_model(tmp_path_factory.mktemp("tiny-tools"), chat_template=TOOLS_CHAT_TEMPLATE)
    engine = {"num_blocks": 128, "page_size": 16, "context_window": 1024, "default_max_tokens": 16}
    settings = Settings(
        models=[
            {"name": "tiny", "backend": "embedded", "model": str(plain), "engine": engine, "tier": "small"},
            {"name": "tiny-tools", "backend": "embedded", "model": str(tools), "engine": engine},
        ],
        upstream={"health_interval_s": 0.2},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        models = lambda: httpx.get(url + "/v1/models", timeout=30).json()["data"]  # noqa: E731
        assert wait_until(lambda: all(m["ready"] for m in models()), timeout_s=MODEL_LOAD_BOUND_S)
        yield url + "/v1", app


@pytest.fixture
def sdk(embedded_proxy):
    with openai.OpenAI(base_url=embedded_proxy[0], api_key="k", max_retries=0) as client:
        yield client


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def test_json_object_is_a_parseable_object(sdk):
    # Greedy: sampled, a random model's free strings run for hundreds of tokens (SmolLM2: test_smollm2.py).
    reply = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format={"type": "json_object"}, temperature=0, max_tokens=200
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content), dict)


@pytest.mark.parametrize(("temperature", "schema"), [(0.0, PERSON), (1.0, PERSON_OF_ENUMS)])
def test_json_schema_nested_is_valid_per_schema(sdk, temperature, schema):
    reply = sdk.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        response_format=_schema_format(schema),
        temperature=temperature,
        seed=7,
        max_tokens=400,
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_json_schema_streamed_is_the_same_answer(sdk):
    fields = dict(
        model="tiny", messages=MESSAGES, response_format=_schema_format(PERSON), temperature=0, max_tokens=400
    )
    whole = sdk.chat.completions.create(**fields).choices[0].message.content
    chunks = list(sdk.chat.completions.create(stream=True, **fields))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # token by token
    jsonschema.validate(json.loads(streamed), PERSON)


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    vaccinated: bool


class Owner(BaseModel):
    name: str
    member: bool
    pets: list[Pet] = Field(max_length=2)  # a greedy random model repeats its last item


def test_the_sdks_parse_with_a_pydantic_model(sdk):
    # The SDK sends a strict schema with $defs and $ref for the nested model.
    reply = sdk.chat.completions.parse(
        model="tiny", messages=MESSAGES, response_format=Owner, temperature=0, max_tokens=300
    )
    owner = reply.choices[0].message.parsed
    assert isinstance(owner, Owner)
    assert all(isinstance(pet, Pet) for pet in owner.pets)


def test_max_tokens_cut_mid_json_is_length(sdk):
    reply = sdk.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=_schema_format(PERSON), temperature=0, max_tokens=5
    )
    assert reply.choices[0].finish_reason == "length"
    content = reply.choices[0].message.content
    assert content.lstrip().startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)


def test_an_image_part_is_a_400_not_a_silent_drop(sdk):
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=messages)
    error = info.value.response.json()["error"]
    assert error["code"] == "unsupported_parameter"
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "Model 'tiny' does not support vision (messages)."


def test_tools_on_a_template_without_tools_are_a_400(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice="required")
    error = info.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", "tools")
    assert "does not support tools" in error["message"]


def test_tool_history_on_a_template_without_tools_is_a_400(sdk):
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=messages)
    assert info.value.response.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_tool_choice_gives_a_valid_call(sdk, temperature):
    reply = sdk.chat.completions.create(
        model="tiny-tools",
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=temperature,
        seed=5,
        max_tokens=200,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_a_named_function_is_the_one_called_streamed_too(sdk):
    fields = dict(
        model="tiny-tools",
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=200,
    )
    whole = sdk.chat.completions.create(**fields).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.tool_calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(whole.message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])
    chunks = [c for c in sdk.chat.completions.create(stream=True, **fields) if c.choices]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or ())]
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == whole.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_answers_in_text(sdk):
    reply = sdk.chat.completions.create(
        model="tiny-tools", messages=MESSAGES, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_tool_result_round_trip_is_answered(sdk):
    first = (
        sdk.chat.completions.create(
            model="tiny-tools",
            messages=MESSAGES,
            tools=[WEATHER],
            tool_choice="required",
            temperature=0,
            max_tokens=200,
        )
        .choices[0]
        .message
    )
    history = [
        *MESSAGES,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "sunny"},
    ]
    reply = sdk.chat.completions.create(
        model="tiny-tools", messages=history, tools=[WEATHER], temperature=0, max_tokens=8
    )
    assert reply.usage.prompt_tokens > len(first.tool_calls[0].function.arguments) // 4
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_capabilities_follow_the_chat_template(embedded_proxy):
    url, app = embedded_proxy
    registry = app.state.services.registry
    plain, tools = registry.get("tiny").capabilities, registry.get("tiny-tools").capabilities
    assert (plain.tools, tools.tools) == (False, True)
    for caps in (plain, tools):
        assert caps.json_object and caps.json_schema and caps.logprobs
        assert not caps.vision and not caps.n and not caps.parallel_tool_calls
        assert caps.context_window == 1024
    cards = {card["id"]: card for card in httpx.get(url + "/models").json()["data"]}
    if "capabilities" in cards["tiny"]:  # the card field comes with routing by capability
        assert cards["tiny"]["capabilities"]["tools"] is False
        assert cards["tiny-tools"]["capabilities"]["tools"] is True
        assert cards["tiny"]["capabilities"]["vision"] is False
