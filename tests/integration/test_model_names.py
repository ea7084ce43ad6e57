"""The `model` of an answer is the configured name the client can send again, in every chunk of a
stream too; the upstream's own name is in `x-switchyard-upstream-model`."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import openai
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.integration.commercial_proxy import commercial_proxy

HI = [{"role": "user", "content": "score=0.9"}]
UPSTREAM = {"cheap": "vendor/cheap-v1", "strong": "vendor/strong-v2", "plain": "vendor/plain-v3"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """`cheap` and `strong` (tiers and cascade rungs) and `plain` (asked without a stream), each
    with an `upstream_model`; the fake upstream answers with the name it was sent."""
    thresholds = tmp_path_factory.mktemp("names") / "thresholds.yaml"
    thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  threshold: 0.45\n")
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        models = [
            {"name": "cheap", "base_url": url, "upstream_model": UPSTREAM["cheap"], "tier": "small"},
            {"name": "strong", "base_url": url, "upstream_model": UPSTREAM["strong"], "tier": "large"},
            {"name": "plain", "base_url": url, "upstream_model": UPSTREAM["plain"], "assemble_from_stream": False},
        ]
        settings = Settings(
            models=models,
            routing={
                "thresholds_file": thresholds,
                "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
            },
            cascade={"ladder": ["cheap", "strong"], "scorer": "mean_logprob", "threshold": -0.5},
            resilience={"max_attempts": 1},
            upstream={"health_timeout_s": 30},  # a probe late on a busy machine must not take a tier out of the routes
        )

        def score_batch(texts):
            return np.array([float(t.rsplit("=", 1)[-1]) for t in texts])

        base = stack.enter_context(serve_in_thread(create_app(settings, score_batch=score_batch)))
        yield base


def _post(base: str, model: str, **body) -> httpx.Response:
    response = httpx.post(base + "/v1/chat/completions", json={"model": model, "messages": HI, **body}, timeout=20)
    assert response.status_code == 200, response.text
    return response


def _stream(base: str, model: str) -> tuple[httpx.Headers, list[dict]]:
    body = {"model": model, "messages": HI, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=20) as response:
        assert response.status_code == 200, response.read()
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return response.headers, [orjson.loads(event) for event in events[:-1]]


@pytest.mark.parametrize("model", ["cheap", "plain"])
def test_an_answer_names_the_configured_model(proxy, model):
    response = _post(proxy, model)
    assert response.json()["model"] == model
    assert response.headers["x-switchyard-upstream-model"] == UPSTREAM[model]


@pytest.mark.parametrize("model", ["cheap", "plain"])
def test_every_chunk_names_the_configured_model(proxy, model):
    headers, chunks = _stream(proxy, model)
    assert len(chunks) > 2
    assert {chunk["model"] for chunk in chunks} == {model}
    assert headers["x-switchyard-upstream-model"] == UPSTREAM[model]


@pytest.mark.parametrize("model", ["auto", "cascade"])
def test_routed_answers_name_the_model_that_answered(proxy, model):
    response = _post(proxy, model)
    answered = response.headers["x-switchyard-model"]
    assert answered in ("cheap", "strong")
    assert response.json()["model"] == answered
    assert response.headers["x-switchyard-upstream-model"] == UPSTREAM[answered]
    headers, chunks = _stream(proxy, model)
    assert {chunk["model"] for chunk in chunks} == {headers["x-switchyard-model"]}


def test_the_sdk_can_send_the_answers_model_again(proxy):
    with openai.OpenAI(base_url=proxy + "/v1", api_key="k", max_retries=0) as sdk:
        first = sdk.chat.completions.create(model="strong", messages=HI)
        again = sdk.chat.completions.create(model=first.model, messages=HI)
    assert again.model == "strong"


def test_litellm_answers_name_the_configured_model():
    with commercial_proxy() as proxy:
        raw = proxy.sdk.chat.completions.with_raw_response.create(model="gpt", messages=HI)
        assert raw.parse().model == "gpt"
        assert raw.headers["x-switchyard-upstream-model"] == "gpt-4o"
        stream = proxy.sdk.chat.completions.create(model="claude", messages=HI, max_tokens=20, stream=True)
        assert {chunk.model for chunk in stream} == {"claude"}
