"""A draft model configured for an embedded model, behind the proxy, through the real `openai` SDK:
the answers are the model's own, the drafts show in `/metrics`, and a draft model that cannot
draft for its target (another tokenizer) is named in the error a request gets."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import build_tiny_model

ENGINE = {"num_blocks": 64, "page_size": 16, "context_window": 1024, "default_max_tokens": 16}
ASK = [{"role": "user", "content": "one two three four five six seven eight nine ten one two three"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    target = build_tiny_model(root / "tiny")
    stranger = build_tiny_model(root / "stranger", corpus=["alpha beta gamma delta epsilon zeta eta theta"] * 40)

    def speculation(draft) -> dict:
        return {"method": "draft_model", "draft_model": str(draft), "num_tokens": 4}

    engines = {
        "tiny-plain": {**ENGINE, "speculation": {"method": "off"}},
        "tiny-drafted": {**ENGINE, "speculation": speculation(target)},
        "tiny-stranger": {**ENGINE, "speculation": speculation(stranger)},
    }
    settings = Settings(
        models=[
            {"name": name, "backend": "embedded", "model": str(target), "engine": engine}
            for name, engine in engines.items()
        ]
    )
    with serve_in_thread(create_app(settings)) as url:
        # bounds a hang only: the stranger never becomes ready, the other two do
        assert wait_until(
            lambda: sum(m["ready"] for m in httpx.get(url + "/v1/models", timeout=60).json()["data"]) == 2,
            timeout_s=MODEL_LOAD_BOUND_S,
        )
        yield url


@pytest.fixture
def sdk(served):
    with openai.OpenAI(base_url=served + "/v1", api_key="k", max_retries=0) as client:
        yield client


def _draft_counts(url: str, model: str) -> tuple[float, float]:
    samples = {
        (s.name, s.labels.get("model")): s.value
        for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
        for s in family.samples
    }
    return (
        samples.get(("switchyard_engine_draft_tokens_total", model), 0.0),
        samples.get(("switchyard_engine_draft_tokens_accepted_total", model), 0.0),
    )


def test_a_drafted_answer_is_the_models_own_and_its_drafts_are_counted(served, sdk):
    plain = sdk.chat.completions.create(model="tiny-plain", messages=ASK, temperature=0, max_tokens=16, logprobs=True)
    drafted = sdk.chat.completions.create(
        model="tiny-drafted", messages=ASK, temperature=0, max_tokens=16, logprobs=True
    )
    assert drafted.choices[0].message.content == plain.choices[0].message.content
    assert [t.token for t in drafted.choices[0].logprobs.content] == [
        t.token for t in plain.choices[0].logprobs.content
    ]
    assert drafted.usage.completion_tokens == plain.usage.completion_tokens
    num_drafts, num_accepted = _draft_counts(served, "tiny-drafted")
    assert num_drafts > 0 and num_accepted == num_drafts  # the model drafting for itself agrees with itself
    assert _draft_counts(served, "tiny-plain") == (0.0, 0.0)


def test_a_draft_model_with_another_tokenizer_is_named_in_the_error(sdk):
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.chat.completions.create(model="tiny-stranger", messages=ASK, max_tokens=4)
    assert caught.value.status_code == 503
    assert "must share the target's tokenizer" in caught.value.message


@pytest.mark.parametrize(
    ("speculation", "message"),
    [
        ({"method": "draft_model"}, "needs speculation.draft_model"),
        ({"method": "prompt_lookup", "draft_model": "smollm2-135m"}, "only read with speculation.method: draft_model"),
    ],
)
def test_draft_model_settings_are_checked(speculation, message):
    with pytest.raises(ValidationError, match=message):
        Settings(
            models=[
                {"name": "m", "backend": "embedded", "model": "smollm2-135m", "engine": {"speculation": speculation}}
            ]
        )
