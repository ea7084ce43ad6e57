"""Capabilities through the proxy and the `openai` SDK: an explicit model that cannot serve a
parameter is a 400 naming it, `auto`, the cascade and fallbacks pass over models that cannot, and
`/v1/models` shows what each model can do.

Three fake upstreams answer with their own word ("small", "large", "top"), so the text says which
model answered; each fake's records say which were called at all.
"""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_for_records

NAMES = ("small", "large", "top", "down")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
UNSURE = [-2.0]  # the cascade's judged rung is never confident with these logprobs

# m-small: no tools, no vision; m-large: no JSON schema; m-top: no vision.
CAPABILITIES = {
    "small": {"tools": False, "vision": False},
    "large": {"json_schema": False},
    "top": {"vision": False},
}
TEAMS = {
    "narrow": {"api_keys": ["sk-narrow"], "models": ["m-small"]},
    "wide": {"api_keys": ["sk-wide"]},
}


@pytest.fixture
def upstreams():
    states = {name: FakeState(behaviour=FakeBehaviour(words=(name,))) for name in NAMES}
    states["down"].behaviour.failure = "500"
    with ExitStack() as stack:
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
        yield urls, states, stack


def _models(urls: dict[str, str], prefix: str = "m") -> list[dict]:
    return [
        {
            "name": f"{prefix}-{name}",
            "base_url": urls[name],
            "tier": name,
            "context_window": 8192,
            "capabilities": CAPABILITIES[name],
        }
        for name in ("small", "large", "top")
    ]


@pytest.fixture
def auto_proxy(upstreams, tmp_path, monkeypatch):
    """Tiers small < large < top by the score in the prompt (thresholds 0.3, 0.7), teams, and
    m-down, which always fails, falling back to m-small then m-large."""
    urls, states, stack = upstreams
    monkeypatch.setenv("SWITCHYARD__BILLING__LEDGER_PATH", str(tmp_path / "usage.db"))  # this test's own ledger
    # and its own spill file: the default one (~/.cache) may hold another test's late records, replayed at start
    monkeypatch.setenv("SWITCHYARD__BILLING__SPILL_PATH", str(tmp_path / "spill.jsonl"))
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  thresholds: [0.3, 0.7]\n")
    settings = Settings(
        models=[*_models(urls), {"name": "m-down", "base_url": urls["down"], "fallbacks": ["m-small", "m-large"]}],
        routing={
            "thresholds_file": thresholds,
            "auto": {"tiers": ["small", "large", "top"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
        },
        resilience={"max_attempts": 1, "breaker_fail_max": 3},
        teams=TEAMS,
    )
    app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
    url = stack.enter_context(serve_in_thread(app))
    yield url + "/v1", states, app


@pytest.fixture
def cascade_proxy(upstreams, tmp_path):
    """The ladder c-small -> c-large -> c-top; c-small is never confident."""
    urls, states, stack = upstreams
    states["small"].behaviour.logprobs = UNSURE
    settings = Settings(
        models=_models(urls, "c"),
        cascade={"ladder": ["c-small", "c-large", "c-top"], "scorer": "mean_logprob", "threshold": -0.5},
        resilience={"max_attempts": 1},
    )
    url = stack.enter_context(serve_in_thread(create_app(settings)))
    yield url + "/v1", states


def _sdk(url: str, key: str = "sk-wide") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def _ask(sdk: openai.OpenAI, model: str, content="hi", **kwargs):
    return sdk.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], **kwargs
    )


def _text(raw) -> str:
    return raw.parse().choices[0].message.content


def _called(raw) -> str:
    """The tool the answer calls (the fake upstreams call a tool when given tools)."""
    return raw.parse().choices[0].message.tool_calls[0].function.name


# -- an explicit model -------------------------------------------------------------------------


def test_an_explicit_model_without_tools_is_a_400_naming_the_parameter(auto_proxy):
    url, states, _ = auto_proxy
    with _sdk(url) as sdk:
        with pytest.raises(openai.BadRequestError) as tools:
            _ask(sdk, "m-small", tools=TOOLS)
        with pytest.raises(openai.BadRequestError) as image:
            sdk.chat.completions.create(model="m-small", messages=[{"role": "user", "content": [IMAGE]}])
        with pytest.raises(openai.BadRequestError) as schema:
            _ask(sdk, "m-large", response_format=SCHEMA, stream=True)
        served = _ask(sdk, "m-large", tools=TOOLS)
    assert tools.value.code == "unsupported_parameter" and tools.value.param == "tools"
    assert tools.value.body["type"] == "invalid_request_error"
    assert tools.value.body["message"] == "Model 'm-small' does not support tools (tools)."
    assert image.value.param == "messages" and "vision" in image.value.message
    assert schema.value.param == "response_format" and "json_schema" in schema.value.message
    assert not states["small"].records  # refused before any call
    assert _called(served) == TOOLS[0]["function"]["name"] and states["large"].records


def test_refusals_never_open_the_breaker_nor_are_metered_as_attempts(auto_proxy):
    url, states, app = auto_proxy
    with _sdk(url) as sdk:
        for _ in range(10):  # over breaker_fail_max (3)
            with pytest.raises(openai.BadRequestError):
                _ask(sdk, "m-small", tools=TOOLS, tool_choice="required")
        plain = _ask(sdk, "m-small")
    assert _text(plain).startswith("small")
    assert app.state.services.executor.states()["m-small"] == "closed"
    assert len(states["small"].records) == 1
    records = wait_for_records(app, 11, timeout_s=30)
    # a refusal is one record of its own (no model, no cost), not an attempt at m-small
    assert sorted((r.model, r.status, r.error) for r in records) == [("", "refused", "unsupported_parameter")] * 10 + [
        ("m-small", "completed", None)
    ]
    assert len(read_ledger(app)) == 11


# -- auto --------------------------------------------------------------------------------------


def test_auto_escalates_past_a_tier_without_tools_and_says_so(auto_proxy):
    url, states, _ = auto_proxy
    with _sdk(url) as sdk:
        routed = _ask(sdk, "auto", "score=0.1", tools=TOOLS)
        plain = _ask(sdk, "auto", "score=0.1")
    assert routed.headers["x-switchyard-model"] == "m-large"
    assert routed.headers["x-switchyard-route"] == "auto:classifier=0.100<0.300->large(small lacks tools)"
    assert _called(routed) == TOOLS[0]["function"]["name"] and states["large"].records[-1].body["tools"] == TOOLS
    assert plain.headers["x-switchyard-route"] == "auto:classifier=0.100<0.300->small"


def test_auto_skips_a_tier_without_json_schema_upward_and_without_vision_downward(auto_proxy):
    url, states, _ = auto_proxy
    with _sdk(url) as sdk:
        schema = _ask(sdk, "auto", "score=0.5", response_format=SCHEMA)
        image = sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "score=0.9"}]}]
        )
        with sdk.chat.completions.with_streaming_response.create(
            model="auto",
            messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "score=0.1"}]}],
            stream=True,
        ) as streamed:
            text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    assert schema.headers["x-switchyard-route"] == "auto:classifier=0.500<0.700->top(large lacks json_schema)"
    assert _text(schema).startswith("top")
    # nothing above top: the nearest tier below that can
    assert image.headers["x-switchyard-route"] == "auto:classifier=0.900>=0.700->large(top lacks vision)"
    assert streamed.headers["x-switchyard-route"] == "auto:classifier=0.100<0.300->large(small lacks vision)"
    assert text.startswith("large")


def test_auto_with_no_tier_that_can_is_a_400(auto_proxy):
    url, states, _ = auto_proxy
    with _sdk(url) as sdk, pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "score=0.5"}]}],
            response_format=SCHEMA,
        )
    assert caught.value.code == "unsupported_parameter"
    assert caught.value.param == "response_format"
    assert caught.value.body["message"] == (
        "No model that model='auto' may pick can serve this request: "
        "m-large lacks json_schema; m-top lacks vision; m-small lacks vision."
    )
    assert not any(states[n].records for n in ("small", "large", "top"))


def test_a_team_limited_to_an_incapable_model_gets_the_400(auto_proxy):
    url, _, _ = auto_proxy
    with _sdk(url, "sk-narrow") as sdk, pytest.raises(openai.BadRequestError) as caught:
        _ask(sdk, "auto", "score=0.9", tools=TOOLS)
    assert caught.value.code == "unsupported_parameter" and caught.value.param == "tools"


# -- fallbacks ---------------------------------------------------------------------------------


def test_fallbacks_pass_over_a_model_that_cannot(auto_proxy):
    url, states, _ = auto_proxy
    with _sdk(url) as sdk:
        with_tools = _ask(sdk, "m-down", tools=TOOLS)
        plain = _ask(sdk, "m-down")
    assert with_tools.headers["x-switchyard-model"] == "m-large"
    assert _text(plain).startswith("small")
    assert len(states["small"].records) == 1  # only the plain request


# -- the cascade -------------------------------------------------------------------------------


def test_the_cascade_skips_a_rung_that_cannot(cascade_proxy):
    url, states = cascade_proxy
    with _sdk(url) as sdk:
        climbed = _ask(sdk, "cascade", response_format=SCHEMA)
        with sdk.chat.completions.with_streaming_response.create(
            model="cascade", messages=[{"role": "user", "content": "hi"}], response_format=SCHEMA, stream=True
        ) as streamed:
            streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
        started_higher = sdk.chat.completions.with_raw_response.create(
            model="cascade", messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "hi"}]}]
        )
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(
                model="cascade",
                messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "hi"}]}],
                response_format=SCHEMA,
            )
    assert _text(climbed).startswith("top")
    assert streamed.headers["x-switchyard-cascade"] == "c-small(-2.00<-0.50)->c-top(c-large lacks json_schema)"
    assert streamed_text.startswith("top")
    assert climbed.headers["x-switchyard-cascade"] == "c-small(-2.00<-0.50)->c-top(c-large lacks json_schema)"
    assert not any(r.body.get("response_format") for r in states["large"].records)
    # c-small cannot see images: the cascade starts at c-large, whose answer is the last word (c-top cannot)
    assert started_higher.headers["x-switchyard-route"] == "cascade->c-large(c-small lacks vision)"
    assert started_higher.headers["x-switchyard-model"] == "c-large"
    assert caught.value.code == "unsupported_parameter"


def test_the_cascades_own_logprobs_do_not_count_as_the_clients_need(upstreams, tmp_path):
    """c-top reports no logprobs (it is the last rung, never judged): a plain request the cascade
    judges on c-large (asking it for logprobs) still climbs to c-top; the client's own logprobs
    request to c-top is refused."""
    urls, states, stack = upstreams
    states["large"].behaviour.logprobs = UNSURE
    models = _models(urls, "c")
    for model in models:
        model["capabilities"] = {"logprobs": model["name"] != "c-top"}
    settings = Settings(
        models=models,
        cascade={"ladder": ["c-large", "c-top"], "scorer": "mean_logprob", "threshold": -0.5},
        resilience={"max_attempts": 1},
    )
    url = stack.enter_context(serve_in_thread(create_app(settings))) + "/v1"
    with _sdk(url) as sdk:
        climbed = _ask(sdk, "cascade")
        with pytest.raises(openai.BadRequestError) as caught:
            _ask(sdk, "c-top", logprobs=True)
    assert climbed.headers["x-switchyard-cascade"] == "c-large(-2.00<-0.50)->c-top"
    assert caught.value.param == "logprobs"


# -- /v1/models ---------------------------------------------------------------------------------


def test_models_show_capabilities_and_one_model_is_retrieved(auto_proxy):
    url, _, _ = auto_proxy
    with _sdk(url) as sdk, _sdk(url, "sk-narrow") as narrow:
        cards = {card.id: card for card in sdk.models.list().data}
        one = sdk.models.retrieve("m-small")
        auto = sdk.models.retrieve("auto")
        narrow_ids = [card.id for card in narrow.models.list().data]
        with pytest.raises(openai.NotFoundError) as unknown:
            sdk.models.retrieve("m-nothing")
        with pytest.raises(openai.NotFoundError) as not_allowed:
            narrow.models.retrieve("m-large")
        with pytest.raises(openai.NotFoundError) as no_cascade:
            sdk.models.retrieve("cascade")
    assert set(cards) == {"m-small", "m-large", "m-top", "m-down", "auto"}
    small = cards["m-small"].model_extra["capabilities"]
    assert small["tools"] is False and small["vision"] is False and small["json_schema"] is True
    assert small["context_window"] == 8192
    assert cards["m-large"].model_extra["capabilities"]["json_schema"] is False
    assert one.id == "m-small" and one.object == "model" and one.owned_by == "switchyard"
    assert one.model_extra["capabilities"] == small
    assert one.model_extra["tier"] == "small"
    # auto can do what any model it routes to can: it escalates to that one
    assert auto.model_extra["capabilities"]["tools"] is True and auto.model_extra["capabilities"]["vision"] is True
    assert narrow_ids == ["m-small", "auto"]
    assert unknown.value.code == "model_not_found" and unknown.value.param == "model"
    assert not_allowed.value.code == "model_not_found"
    assert no_cascade.value.code == "model_not_found"


def test_the_cascade_has_a_card(cascade_proxy):
    url, _ = cascade_proxy
    with _sdk(url) as sdk:
        card = sdk.models.retrieve("cascade")
        ids = [c.id for c in sdk.models.list().data]
    assert ids == ["c-small", "c-large", "c-top", "cascade"]
    assert card.model_extra["capabilities"]["json_schema"] is True
    assert card.model_extra["capabilities"]["context_window"] == 8192
