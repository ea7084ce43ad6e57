"""`POST /v1/responses` with the real `openai` SDK: the Responses API answered by the chat path.

Two fake OpenAI upstreams, `m-small` (unsure of itself: a cascade climbs past it) and `m-large`,
behind one proxy with `auto` (the classifier's score is read out of the prompt) and a cascade.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import httpx
import numpy as np
import openai
import orjson
import pydantic
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_for_records, wait_until

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}


@pytest.fixture
def proxy(tmp_path, monkeypatch):
    # this test's own ledger (the environment wins over the config, and the suite's points at one
    # shared by every test of a worker) and spill file, so that counting its records counts its own
    monkeypatch.setenv("SWITCHYARD__BILLING__LEDGER_PATH", str(tmp_path / "usage.db"))
    monkeypatch.setenv("SWITCHYARD__BILLING__SPILL_PATH", str(tmp_path / "spill.jsonl"))
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        settings = Settings(
            models=[{"name": f"m-{tier}", "base_url": url, "tier": tier} for tier, url in urls.items()]
            + [{"name": "m-plain", "base_url": urls["large"], "capabilities": {"tools": False, "json_schema": False}}],
            # a classifier late on a busy machine must not send a request to the default tier
            routing={
                "auto": {
                    "tiers": ["small", "large"],
                    "thresholds": [0.45],
                    "warm_up": False,
                    "max_wait_ms": 1,
                    "deadline_ms": 10_000,
                }
            },
            cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
            upstream={"health_timeout_s": 30},  # nor a late health probe take a tier out of the routes
            billing={"ledger_path": tmp_path / "usage.db"},
        )
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        url = stack.enter_context(serve_in_thread(app))
        sdk = stack.enter_context(openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0))
        yield sdk, states, app


def _sent(state: FakeState) -> dict:
    return state.records[-1].body


def test_a_string_input_is_answered_as_a_response(proxy):
    sdk, states, app = proxy
    raw = sdk.responses.with_raw_response.create(model="m-large", input="hi")
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.model == "m-large"
    assert response.output_text == "large " * 5
    [message] = response.output
    assert (message.type, message.role, message.content[0].type) == ("message", "assistant", "output_text")
    assert response.usage.output_tokens == 5
    assert response.usage.total_tokens == response.usage.input_tokens + 5
    assert _sent(states["large"])["messages"] == [{"role": "user", "content": "hi"}]
    assert raw.headers["x-switchyard-model"] == "m-large"
    [record] = wait_for_records(app, 1, timeout_s=30, request_id=raw.headers["x-request-id"])
    assert (record.status, record.model, record.completion_tokens) == ("completed", "m-large", 5)


def test_instructions_items_and_settings_reach_the_upstream_as_a_chat_request(proxy):
    sdk, states, _ = proxy
    response = sdk.responses.create(
        model="m-large",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "noted"}]},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
                ],
            },
        ],
        max_output_tokens=2,
        temperature=0.5,
        top_p=0.9,
        metadata={"ticket": "42"},
        user="u-1",
    )
    sent = _sent(states["large"])
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "noted"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            ],
        },
    ]
    assert sent["max_completion_tokens"] == 2
    assert (sent["temperature"], sent["top_p"], sent["metadata"], sent["user"]) == (0.5, 0.9, {"ticket": "42"}, "u-1")
    assert "input" not in sent and "instructions" not in sent and "max_output_tokens" not in sent
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "large large "
    assert (response.instructions, response.max_output_tokens, response.metadata) == ("Be brief.", 2, {"ticket": "42"})


def test_text_format_json_schema_reaches_the_upstream_as_response_format(proxy):
    sdk, states, _ = proxy
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    sdk.responses.create(
        model="m-large",
        input="hi",
        text={"format": {"type": "json_schema", "name": "reply", "schema": schema, "strict": True}},
    )
    assert _sent(states["large"])["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": schema, "strict": True},
    }
    sdk.responses.create(model="m-large", input="hi", text={"format": {"type": "json_object"}})
    assert _sent(states["large"])["response_format"] == {"type": "json_object"}


def test_the_sdk_parse_helper_gets_its_schema_to_the_upstream_and_parses_the_answer(proxy):
    class Reply(pydantic.BaseModel):
        answer: str

    sdk, states, _ = proxy
    states["large"].behaviour.words, states["large"].behaviour.num_tokens = ('{"answer": "42"}',), 1
    parsed = sdk.responses.parse(model="m-large", input="the answer?", text_format=Reply)
    assert parsed.output_parsed == Reply(answer="42")
    response_format = _sent(states["large"])["response_format"]
    assert response_format["type"] == "json_schema" and response_format["json_schema"]["name"] == "Reply"
    assert response_format["json_schema"]["schema"]["required"] == ["answer"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_and_its_output_round_trip(proxy, stream):
    sdk, states, _ = proxy
    states["large"].behaviour.tool_arguments = CALL["arguments"]
    asked = {"model": "m-large", "input": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER_TOOL]}
    if stream:
        with sdk.responses.stream(**asked) as events:
            first = events.get_final_response()
    else:
        first = sdk.responses.create(**asked, tool_choice={"type": "function", "name": "get_weather"})
        assert _sent(states["large"])["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert _sent(states["large"])["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER_TOOL["parameters"],
                "strict": True,
            },
        }
    ]
    [call] = first.output
    assert (call.type, call.call_id, call.name, call.arguments) == ("function_call", "call_fake_0", *CALL.values())
    assert first.status == "completed"

    follow_up = [
        *asked["input"],
        *first.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
    ]
    second = sdk.responses.create(model="m-large", input=follow_up, tools=[WEATHER_TOOL])
    assert _sent(states["large"])["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_fake_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": CALL["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_fake_0", "content": "18C"},
    ]
    assert second.output_text == "large " * 5


def test_a_stream_has_the_documented_events_in_order(proxy):
    sdk, states, app = proxy
    states["large"].behaviour.num_tokens = 3
    with sdk.responses.with_streaming_response.create(model="m-large", input="hi", stream=True) as raw:
        request_id = raw.headers["x-request-id"]
        assert raw.headers["content-type"].startswith("text/event-stream")
        events = list(raw.parse())
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "large large large "
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    completed = events[-1].response
    assert completed.id == events[0].response.id and completed.status == "completed"
    assert completed.output_text == "large large large " and completed.usage.output_tokens == 3
    assert _sent(states["large"])["stream_options"] == {"include_usage": True}
    [record] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
    assert (record.status, record.completion_tokens) == ("completed", 3)


def test_the_stream_helper_gives_the_final_response_and_text_deltas(proxy):
    sdk, _, _ = proxy
    with sdk.responses.stream(model="m-large", input="hi", max_output_tokens=2) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert deltas == ["large ", "large "]
    with sdk.responses.stream(model="m-large", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "large " * 5 and final.status == "completed"


def test_a_client_that_leaves_a_stream_cancels_the_upstream_and_is_metered_once(proxy):
    sdk, states, app = proxy
    # 10,000 tokens 0.05 s apart: still streaming when the client leaves, however slow the machine
    states["large"].behaviour.num_tokens, states["large"].behaviour.token_delay_s = 10_000, 0.05

    async def read_four_events_then_leave() -> str:
        async with openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="k", max_retries=0) as client:
            async with client.responses.with_streaming_response.create(
                model="m-large", input="long story", stream=True
            ) as raw:
                events = aiter(await raw.parse())
                for _ in range(4):
                    await anext(events)
                return raw.headers["x-request-id"]

    request_id = asyncio.run(read_four_events_then_leave())
    record = states["large"].records[-1]
    assert wait_until(lambda: record.disconnected_at is not None, timeout_s=30)
    [metered] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
    assert metered.status == "cancelled" and metered.completion_tokens < 10_000


def test_a_stream_cut_after_its_first_event_ends_with_error_and_response_failed(proxy):
    sdk, states, app = proxy
    states["large"].behaviour.failure, states["large"].behaviour.drop_after = "drop", 2
    with sdk.responses.with_streaming_response.create(model="m-large", input="hi", stream=True) as raw:
        request_id = raw.headers["x-request-id"]
        events = list(raw.parse())
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-2].code in ("upstream_error", "upstream_unavailable") and events[-2].message
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == events[-2].code
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "large large "
    [record] = wait_for_records(app, 1, timeout_s=30, request_id=request_id)
    assert record.status == "failed"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_routes_a_responses_request(proxy, stream):
    sdk, states, app = proxy
    with sdk.responses.with_streaming_response.create(
        model="auto", input="score=0.9", stream=stream, extra_headers={"x-switchyard-cascade": "off"}
    ) as raw:
        headers = raw.headers
        body = raw.read()
    assert headers["x-switchyard-route"] == "auto:classifier=0.900>=0.450->large"
    assert headers["x-switchyard-model"] == "m-large"
    assert b"large " in body
    if stream:  # every event names the model that answers, from response.created on
        events = [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith(b"data: ")]
        models = {e["response"]["model"] for e in events if "response" in e}
        assert models == {"m-large"} and events[0]["type"] == "response.created"
    assert states["small"].num_requests == 0
    assert len(wait_for_records(app, 1, timeout_s=30, request_id=headers["x-request-id"])) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_the_cascade_climbs_for_a_responses_request(proxy, stream):
    sdk, states, app = proxy
    if stream:
        with sdk.responses.with_streaming_response.create(model="cascade", input="hi", stream=True) as raw:
            headers, events = raw.headers, list(raw.parse())
        text = events[-1].response.output_text
    else:
        raw = sdk.responses.with_raw_response.create(model="cascade", input="hi")
        headers, text = raw.headers, raw.parse().output_text
    assert headers["x-switchyard-cascade"] == "m-small(-3.00<-1.00)->m-large"
    assert text == "large " * 5
    assert (states["small"].num_requests, states["large"].num_requests) == (1, 1)
    records = wait_for_records(app, 2, timeout_s=30, request_id=headers["x-request-id"])
    assert sorted(r.model for r in records) == ["m-large", "m-small"]  # one record per attempt


@pytest.mark.parametrize(
    ("asked", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ],
)
def test_what_a_stateless_proxy_cannot_do_is_a_400_naming_the_parameter(proxy, asked, param):
    sdk, states, app = proxy
    num_records = len(read_ledger(app))
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(**{"model": "m-large", "input": "hi"} | asked)
    error = info.value.response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("unsupported_parameter", param, "invalid_request_error")
    assert states["large"].num_requests == 0
    assert len(read_ledger(app)) == num_records
    assert read_ledger(app, request_id=info.value.response.headers["x-request-id"]) == []


def test_store_false_is_served(proxy):
    sdk, _, _ = proxy
    assert sdk.responses.create(model="m-large", input="hi", store=False).status == "completed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m-large"}, "input"),
        ({"model": "m-large", "input": []}, "input"),
        ({"model": "m-large", "input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
        ({"model": "m-large", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": "m-large", "input": "hi", "temperature": "hot"}, "temperature"),
        ({"model": "m-large", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_parameter(proxy, body, param):
    sdk, _, _ = proxy
    response = httpx.post(str(sdk.base_url) + "responses", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_unknown_fields_are_forwarded_as_for_chat(proxy):
    sdk, states, _ = proxy
    sdk.responses.create(model="m-large", input="hi", extra_body={"top_k": 5}, service_tier="default")
    sent = _sent(states["large"])
    assert (sent["top_k"], sent["service_tier"]) == (5, "default")


def test_an_upstream_refusal_before_the_first_byte_is_a_real_status(proxy):
    sdk, states, _ = proxy
    states["large"].behaviour.failure = "400"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="m-large", input="hi", stream=True)
    assert orjson.loads(info.value.response.read())["error"]["message"]


def test_keys_allowed_models_and_budgets_hold_for_responses(fake_upstream):
    price = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}
    settings = Settings(
        models=[
            {"name": "cheap", "base_url": fake_upstream, "price": price},
            {"name": "other", "base_url": fake_upstream},
        ],
        teams={
            "web": {"api_keys": ["sk-web"], "models": ["cheap"]},
            "broke": {"api_keys": ["sk-broke"], "budget_usd_per_day": 0},
        },
        billing={"ledger_path": None},
    )
    with serve_in_thread(create_app(settings)) as url:
        body = {"model": "cheap", "input": "hi"}
        without_key = httpx.post(url + "/v1/responses", json=body)
        with openai.OpenAI(base_url=url + "/v1", api_key="sk-web", max_retries=0) as web:
            assert web.responses.create(**body).status == "completed"
            with pytest.raises(openai.PermissionDeniedError) as denied:
                web.responses.create(model="other", input="hi")
        with openai.OpenAI(base_url=url + "/v1", api_key="sk-broke", max_retries=0) as broke:
            with pytest.raises(openai.RateLimitError) as spent:
                broke.responses.create(**body)
    assert without_key.status_code == 401 and without_key.json()["error"]["code"] == "invalid_api_key"
    assert denied.value.response.json()["error"]["code"] == "model_not_allowed"
    assert spent.value.response.json()["error"]["code"] == "insufficient_quota"


@pytest.mark.parametrize("stream", [False, True])
def test_a_litellm_model_answers_a_responses_request(stream):
    anthropic = AnthropicState()
    with ExitStack() as stack:
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(anthropic)))
        model = {
            "name": "claude",
            "backend": "litellm",
            "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
            "base_url": anthropic_url,
            "api_key": "sk-ant-test",
        }
        settings = Settings(models=[model], resilience={"max_attempts": 1}, billing={"ledger_path": None})
        url = stack.enter_context(serve_in_thread(create_app(settings)))
        sdk = stack.enter_context(openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0))
        asked = {"model": "claude", "instructions": "Be kind.", "input": "hi", "max_output_tokens": 50}
        if stream:
            with sdk.responses.stream(**asked) as events:
                response = events.get_final_response()
        else:
            response = sdk.responses.create(**asked)
    assert response.output_text == "bonjour from claude "
    assert response.status == "completed" and response.usage.output_tokens == 3


def test_what_a_model_cannot_do_is_a_400_naming_the_parameter_the_client_sent(proxy):
    sdk, states, _ = proxy
    before = len(states["large"].records)
    with pytest.raises(openai.BadRequestError) as tools:
        sdk.responses.create(model="m-plain", input="weather?", tools=[WEATHER_TOOL])
    schema = {"type": "json_schema", "name": "city", "schema": {"type": "object", "properties": {}}}
    with pytest.raises(openai.BadRequestError) as text_format:
        sdk.responses.create(model="m-plain", input="a city", text={"format": schema})
    assert (tools.value.code, tools.value.param) == ("unsupported_parameter", "tools")
    assert (text_format.value.code, text_format.value.param) == ("unsupported_parameter", "text.format")
    assert "m-plain" in str(text_format.value) and "json_schema" in str(text_format.value)
    assert len(states["large"].records) == before  # refused before any call
    assert sdk.responses.create(model="m-plain", input="hi").status == "completed"
