"""What a client sends beyond the standard fields reaches the provider through the LiteLLM backend,
translated where LiteLLM knows the field and passed through where it does not; what the model
cannot take is a 400 naming the field, never dropped in silence."""

from __future__ import annotations

import openai
import pytest

from tests.integration.commercial_proxy import commercial_proxy

HI = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def proxy():
    with commercial_proxy() as proxy:
        yield proxy


def test_openai_provider_receives_every_field(proxy):
    proxy.sdk.chat.completions.create(
        model="gpt",
        messages=HI,
        tools=[WEATHER],
        parallel_tool_calls=False,
        metadata={"team": "search"},
        service_tier="auto",
        user="user-7",
        extra_body={"top_k": 5, "my_field": {"nested": [1, 2]}, "tags": ["a"]},
    )
    sent = proxy.last_sent("gpt")
    assert sent["parallel_tool_calls"] is False
    assert sent["metadata"] == {"team": "search"}
    assert sent["service_tier"] == "auto"
    assert sent["user"] == "user-7"
    assert sent["top_k"] == 5
    assert sent["my_field"] == {"nested": [1, 2]}
    assert sent["tags"] == ["a"]  # a LiteLLM setting's name, still the client's field
    assert sent["model"] == "gpt-4o"


def test_reasoning_effort_reaches_a_reasoning_model(proxy):
    proxy.sdk.chat.completions.create(model="reasoner", messages=HI, reasoning_effort="low")
    assert proxy.last_sent("reasoner")["reasoning_effort"] == "low"


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [("gpt", "reasoning_effort", "low"), ("claude", "reasoning_effort", "low"), ("claude", "logprobs", True)],
)
def test_a_field_the_model_cannot_take_is_a_400_naming_it(proxy, model, field, value):
    num_sent = proxy.num_sent(model)
    with pytest.raises(openai.BadRequestError) as info:
        proxy.sdk.chat.completions.create(model=model, messages=HI, max_tokens=10, **{field: value})
    error = info.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_parameter", field)
    assert f"'{model}'" in error["message"]
    assert proxy.num_sent(model) == num_sent  # refused before the provider was called


def test_anthropic_receives_its_own_forms(proxy):
    proxy.sdk.chat.completions.create(
        model="claude",
        messages=HI,
        max_tokens=20,
        tools=[WEATHER],
        parallel_tool_calls=False,
        metadata={"user_id": "user-7"},
        extra_body={"top_k": 5, "my_field": "x"},
    )
    sent = proxy.last_sent("claude")
    assert sent["top_k"] == 5
    assert sent["my_field"] == "x"
    assert sent["metadata"] == {"user_id": "user-7"}
    assert sent["tool_choice"]["disable_parallel_tool_use"] is True


def test_a_litellm_setting_cannot_be_set_by_a_client(proxy):
    """`api_base` and the like are LiteLLM's own arguments: a client's field of that name must not
    redirect the call (and its key) elsewhere. To an OpenAI-compatible provider it is a body field."""
    proxy.sdk.chat.completions.create(
        model="gpt", messages=HI, extra_body={"api_base": "http://127.0.0.1:9/v1", "mock_response": "hacked"}
    )
    sent = proxy.last_sent("gpt")
    assert (sent["api_base"], sent["mock_response"]) == ("http://127.0.0.1:9/v1", "hacked")
    num_sent = proxy.num_sent("claude")
    with pytest.raises(openai.BadRequestError) as info:
        proxy.sdk.chat.completions.create(
            model="claude", messages=HI, max_tokens=10, extra_body={"mock_response": "hacked"}
        )
    assert info.value.response.json()["error"]["param"] == "mock_response"
    assert proxy.num_sent("claude") == num_sent


@pytest.mark.parametrize(
    "field",
    ["callbacks", "success_callback", "drop_params", "aws_bedrock_runtime_endpoint", "vertex_project", "mock_delay"],
)
def test_litellm_reads_none_of_its_own_settings_from_a_client(proxy, field):
    """Callbacks would be installed for the whole process (every team's prompts to a logging
    service); drop_params would silently drop what a model cannot take; cloud settings would
    redirect or bill elsewhere."""
    import litellm

    before = [list(litellm.callbacks), list(litellm.success_callback), list(litellm._async_success_callback)]
    value = ["langsmith"] if "callback" in field else "x"
    proxy.sdk.chat.completions.create(model="gpt", messages=HI, extra_body={field: value})
    assert proxy.last_sent("gpt")[field] == value  # an OpenAI-compatible provider gets a plain body field
    with pytest.raises(openai.BadRequestError) as info:
        proxy.sdk.chat.completions.create(model="claude", messages=HI, max_tokens=10, extra_body={field: value})
    assert info.value.code == "unsupported_parameter" and info.value.param == field
    assert [list(litellm.callbacks), list(litellm.success_callback), list(litellm._async_success_callback)] == before
