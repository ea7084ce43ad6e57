"""Commercial backends through LiteLLM, against fake OpenAI and Anthropic servers on 127.0.0.1;
the client is always the `openai` SDK and always sees OpenAI's format."""

from __future__ import annotations

import openai
import pytest

from switchyard.core.settings import Settings
from tests.integration.commercial_proxy import commercial_proxy

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def commercial():
    with commercial_proxy() as proxy:
        yield proxy.sdk, proxy.claude, proxy.gpt, proxy.app


def test_an_anthropic_upstream_answers_an_openai_request(commercial):
    sdk, anthropic, _, _ = commercial
    raw = sdk.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "system", "content": "Be kind."}, *HI], max_tokens=50
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "bonjour from claude "
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == 12 and reply.usage.completion_tokens == 3
    assert raw.headers["x-switchyard-model"] == "claude"
    assert raw.headers["x-switchyard-backend"] == "litellm#0"
    sent = anthropic.requests[-1]
    assert sent["model"] == "claude-3-5-sonnet-20241022"
    assert sent["system"] in ("Be kind.", [{"type": "text", "text": "Be kind."}])
    assert anthropic.headers[-1]["x-api-key"] == "sk-ant-test"


def test_an_anthropic_stream_becomes_an_openai_stream(commercial):
    sdk, _, _, _ = commercial
    chunks = list(
        sdk.chat.completions.create(
            model="claude", messages=HI, max_tokens=50, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "bonjour from claude "
    assert any(c.usage and c.usage.completion_tokens == 3 for c in chunks)


def test_openai_through_litellm(commercial):
    sdk, _, openai_state, _ = commercial
    reply = sdk.chat.completions.create(model="gpt", messages=HI, temperature=0.2)
    assert reply.choices[0].message.content == "alpha bravo charlie delta echo "
    assert openai_state.records[-1].body["temperature"] == 0.2
    assert openai_state.records[-1].headers["authorization"] == "Bearer sk-test"
    chunks = list(sdk.chat.completions.create(model="gpt", messages=HI, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "alpha bravo charlie delta echo "
    assert openai_state.records[-1].body["stream"] is True


@pytest.mark.parametrize(
    ("failure", "error_class", "status"),
    [("429", openai.RateLimitError, 429), ("529", openai.InternalServerError, 503)],
)
def test_provider_errors_are_translated(commercial, failure, error_class, status):
    sdk, anthropic, _, _ = commercial
    anthropic.failure = failure
    with pytest.raises(error_class) as info:
        sdk.chat.completions.create(model="claude", messages=HI, max_tokens=10)
    assert info.value.status_code == status
    assert set(info.value.response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_prompt_too_long_is_a_400(commercial):
    sdk, anthropic, _, _ = commercial
    anthropic.failure = "400"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="claude", messages=HI, max_tokens=10)
    assert "prompt is too long" in info.value.response.json()["error"]["message"]


def test_prices_come_from_litellm_unless_configured(commercial):
    from switchyard.backends.registry import build_registry
    from switchyard.core.prices import Price
    from switchyard.gateway.services import model_prices

    _, _, _, app = commercial
    price = app.state.services.prices["gpt"]
    assert (price.input_usd_per_mtok, price.output_usd_per_mtok) == pytest.approx((2.5, 10.0))
    priced = Settings(
        models=[
            {
                "name": "x",
                "backend": "litellm",
                "litellm_model": "openai/gpt-4o",
                "price": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2},
            }
        ]
    )
    assert model_prices(priced, build_registry(priced, None)) == {"x": Price(1, 2)}
