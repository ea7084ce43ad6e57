"""LoRA adapters as models of their own, seen from the API: who may use one, how `/v1/models` lists
it, how a team's default adapter rides on its `auto` routes, and what an adapter's answer costs."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.fakes.vllm_upstream import FakeLoRA, FakeVLLMUpstream

HOUR_S = 3600
PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
OWN_PRICE = {"input_usd_per_mtok": 10.0, "output_usd_per_mtok": 20.0}
KEYS = {"legal": "sk-legal", "support": "sk-support", "plain": "sk-plain"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def proxy():
    vllm_state, big_state = FakeState(model_id="base"), FakeState()
    lora = FakeLoRA(paths={"/adapters/support", "/adapters/legal"})
    with ExitStack() as stack:
        vllm = stack.enter_context(serve_in_thread(FakeVLLMUpstream(vllm_state, lora=lora))) + "/v1"
        big = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(big_state))) + "/v1"
        settings = Settings(
            models=[
                {
                    "name": "base",
                    "backend": "vllm",
                    "base_url": vllm,
                    "tier": "small",
                    "context_window": 4096,
                    "price": PRICE,
                    "vllm": {"metrics_interval_s": HOUR_S},
                    "adapters": [
                        {"name": "support", "path": "/adapters/support"},
                        {"name": "legal", "path": "/adapters/legal", "teams": ["legal"], "price": OWN_PRICE},
                    ],
                },
                {"name": "big", "base_url": big, "tier": "large", "price": PRICE},
            ],
            routing={"auto": {"tiers": ["small", "large"], "thresholds": [0.5], "warm_up": False}},
            teams={
                "legal": {"api_keys": [KEYS["legal"]], "default_adapters": ["legal"]},
                "support": {"api_keys": [KEYS["support"]], "models": ["base", "big"], "default_adapters": ["support"]},
                "plain": {"api_keys": [KEYS["plain"]]},
            },
            upstream={"health_interval_s": HOUR_S},
        )
        app = create_app(settings, score_batch=lambda texts: np.zeros(len(texts)))  # every prompt: small
        base = stack.enter_context(serve_in_thread(app)) + "/v1"
        yield base, vllm_state


def _sdk(base: str, team: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=KEYS[team], max_retries=0, timeout=30)


def test_models_list_adapters_with_their_base_model_to_the_teams_that_may_use_them(proxy):
    base, _ = proxy
    listed = httpx.get(base + "/models", headers={"authorization": f"Bearer {KEYS['legal']}"}).json()["data"]
    cards = {card["id"]: card for card in listed}
    assert (cards["legal"]["parent"], cards["support"]["parent"], cards["base"]["parent"]) == ("base", "base", None)
    assert cards["legal"]["context_window"] == cards["base"]["context_window"] == 4096
    with _sdk(base, "plain") as plain:
        assert {m.id for m in plain.models.list().data} >= {"base", "support"}
        assert "legal" not in {m.id for m in plain.models.list().data}
        with pytest.raises(openai.NotFoundError):
            plain.models.retrieve("legal")
        with pytest.raises(openai.PermissionDeniedError) as refused:
            plain.chat.completions.create(model="legal", messages=HI)
        assert refused.value.body["code"] == "model_not_allowed"


def test_a_team_that_may_use_the_base_model_may_use_its_open_adapters(proxy):
    base, state = proxy
    with _sdk(base, "support") as support:
        raw = support.chat.completions.with_raw_response.create(model="support", messages=HI)
    assert raw.headers["x-switchyard-model"] == "support" and raw.parse().model == "support"
    assert state.records[-1].body["model"] == "support"  # how vLLM is asked for an adapter


def test_auto_applies_the_teams_default_adapter_on_its_base_model(proxy):
    base, state = proxy
    with _sdk(base, "legal") as legal:
        raw = legal.chat.completions.with_raw_response.create(model="auto", messages=HI)
    assert raw.headers["x-switchyard-model"] == "legal"
    assert raw.headers["x-switchyard-route"].endswith("->small+adapter:legal")
    assert state.records[-1].body["model"] == "legal"
    usage = raw.parse().usage
    # the adapter's own price
    expected = (usage.prompt_tokens * 10.0 + usage.completion_tokens * 20.0) / 1e6
    assert float(raw.headers["x-switchyard-cost-usd"]) == pytest.approx(expected)
    with _sdk(base, "plain") as plain:
        raw = plain.chat.completions.with_raw_response.create(model="auto", messages=HI)
    assert raw.headers["x-switchyard-model"] == "base" and "+adapter" not in raw.headers["x-switchyard-route"]
    assert state.records[-1].body["model"] == "base"


def test_an_adapter_without_a_price_of_its_own_costs_what_its_base_model_does(proxy):
    base, _ = proxy
    with _sdk(base, "support") as support:
        raw = support.chat.completions.with_raw_response.create(model="auto", messages=HI)
    assert raw.headers["x-switchyard-model"] == "support"
    usage = raw.parse().usage
    expected = (usage.prompt_tokens * 1.0 + usage.completion_tokens * 2.0) / 1e6
    assert float(raw.headers["x-switchyard-cost-usd"]) == pytest.approx(expected)
