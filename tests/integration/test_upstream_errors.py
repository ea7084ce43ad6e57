"""A provider's refusal reaches the client with its own `code` and `param`, through an `openai`
backend and through LiteLLM, and never counts against the model's circuit breaker."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

HI = [{"role": "user", "content": "hi"}]
FAIL_MAX = 2


@pytest.fixture
def proxy():
    """`direct` (backend openai) and `gpt` (litellm) on one fake OpenAI, `claude` on a fake Anthropic."""
    openai_state, anthropic = FakeState(), AnthropicState()
    with ExitStack() as stack:
        openai_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(openai_state))) + "/v1"
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(anthropic)))
        litellm = {"backend": "litellm", "api_key": "sk-test"}
        models = [
            {"name": "direct", "base_url": openai_url},
            {"name": "gpt", "litellm_model": "openai/gpt-4o", "base_url": openai_url, **litellm},
            {
                "name": "claude",
                "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                "base_url": anthropic_url,
                **litellm,
            },
        ]
        resilience = {"max_attempts": 2, "backoff_base_s": 0, "breaker_fail_max": FAIL_MAX, "breaker_reset_s": 60}
        base = stack.enter_context(serve_in_thread(create_app(Settings(models=models, resilience=resilience))))
        sdk = stack.enter_context(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0))
        yield sdk, base, openai_state, anthropic


@pytest.mark.parametrize("model", ["direct", "gpt"])
def test_the_providers_code_and_param_reach_the_client(proxy, model):
    sdk, _, openai_state, _ = proxy
    openai_state.behaviour.failure, openai_state.behaviour.error_param = "400", "messages"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=model, messages=HI)
    error = info.value.response.json()["error"]
    assert error["code"] == "content_policy_violation"
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    assert "safety system" in error["message"]
    assert openai_state.num_requests == 1  # a refusal is not retried


@pytest.mark.parametrize("model", ["direct", "gpt", "claude"])
def test_provider_refusals_never_open_the_breaker(proxy, model):
    sdk, base, openai_state, anthropic = proxy
    openai_state.behaviour.failure, anthropic.failure = "400", "400"
    for _ in range(3 * FAIL_MAX):
        with pytest.raises(openai.BadRequestError):
            sdk.chat.completions.create(model=model, messages=HI, max_tokens=10)
    assert httpx.get(base + "/health/ready").json()["breakers"][model] == "closed"
    openai_state.behaviour.failure, anthropic.failure = None, None
    assert sdk.chat.completions.create(model=model, messages=HI, max_tokens=10).choices[0].message.content


def test_the_providers_refusal_of_our_key_is_not_the_clients_401(proxy):
    """The client's key to the proxy is fine: a provider that refuses the configured key is an
    upstream failure (502, as an `openai` backend says it), not an AuthenticationError for the client."""
    sdk, _, _, anthropic = proxy
    anthropic.failure = "401"
    with pytest.raises(openai.APIStatusError) as info:
        sdk.chat.completions.create(model="claude", messages=HI, max_tokens=10)
    assert info.value.status_code == 502
    assert "invalid x-api-key" in info.value.response.json()["error"]["message"]


def test_a_message_litellm_cannot_translate_is_a_400_that_never_opens_the_breaker(proxy):
    """LiteLLM reports its own check of a message as a connection error: it was a 503 counted by
    the breaker, so a few malformed requests shut the model for everyone."""
    sdk, base, _, anthropic = proxy
    bogus = [{"role": "user", "content": [{"type": "bogus"}]}]
    for _ in range(3 * FAIL_MAX):
        with pytest.raises(openai.BadRequestError) as info:
            sdk.chat.completions.create(model="claude", messages=bogus, max_tokens=10)
    assert info.value.param == "messages" and "Invalid user message" in info.value.message
    assert not anthropic.requests  # nothing was sent
    assert httpx.get(base + "/health/ready").json()["breakers"]["claude"] == "closed"
    assert sdk.chat.completions.create(model="claude", messages=HI, max_tokens=10).choices[0].message.content
