"""model="auto" by value through the proxy and the `openai` SDK: three tiers, the cheapest whose
predicted quality is close enough to the best one's, explained in the route header."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import openai
import pytest
import yaml

from switchyard.classifier.model import BY_VALUE_ARTIFACT, STATIC_ARTIFACT, ComplexityClassifier
from switchyard.core.settings import Settings
from switchyard.core.thresholds import ThresholdsError, write_by_value, write_section
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

TIERS = ["small", "large", "commercial"]
LLMROUTER = {  # three models the shipped artifact was trained on, graded on the same prompts
    "small": "llama-3.1-8b-instruct",
    "large": "llama-3.3-nemotron-super-49b-v1",
    "commercial": "llama-3.1-nemotron-51b-instruct",
}
PRICES = {"small": (0.1, 0.1), "large": (1.0, 2.0), "commercial": (10.0, 30.0)}


def _settings(urls: dict[str, str], thresholds, **auto) -> Settings:
    return Settings(
        models=[
            {
                "name": f"m-{tier}",
                "base_url": url,
                "tier": tier,
                "price": {"input_usd_per_mtok": PRICES[tier][0], "output_usd_per_mtok": PRICES[tier][1]},
            }
            for tier, url in urls.items()
        ],
        routing={
            "thresholds_file": thresholds,
            "auto": {"tiers": TIERS, "deadline_ms": 60_000, "max_wait_ms": 1, **auto},
        },
        upstream={"health_timeout_s": 30},
    )


@pytest.fixture
def upstreams():
    states = {tier: FakeState(behaviour=FakeBehaviour(words=(tier,))) for tier in TIERS}
    with ExitStack() as stack:
        yield (
            stack,
            {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()},
        )


@pytest.fixture
def thresholds(tmp_path):
    """A classifier's thresholds (two tiers' worth) plus routing by value for three tiers."""
    path = tmp_path / "thresholds.yaml"
    write_section(path, "routing", {"router": "classifier", "threshold": 0.45})
    write_by_value(
        path,
        {
            "quality_models": LLMROUTER,
            "tolerance": 0.05,
            "modes": {"economy": {"tolerance": 0.3}, "max": {"tolerance": 0.01}},
        },
    )
    return path


def _ask(sdk, text: str, **kwargs):
    return sdk.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], **kwargs
    )


def test_routes_by_value_and_says_why(upstreams, thresholds):
    stack, urls = upstreams

    def score_batch(texts):  # the prompt carries its row: "q=<score>,<small>,<large>,<commercial>"
        return np.array([[float(v) for v in t.rsplit("=", 1)[-1].split(",")] for t in texts])

    app = create_app(_settings(urls, thresholds, warm_up=False), score_batch=score_batch)
    base = stack.enter_context(serve_in_thread(app))
    url = base + "/v1"
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        close = _ask(sdk, "q=0.2,0.70,0.73,0.74")
        far = _ask(sdk, "q=0.9,0.50,0.70,0.72")
        strict = _ask(sdk, "q=0.9,0.50,0.70,0.72", extra_headers={"x-switchyard-quality": "max"})
        loose = _ask(sdk, "q=0.9,0.50,0.70,0.72", extra_headers={"x-switchyard-quality": "economy"})
        with sdk.chat.completions.with_streaming_response.create(
            model="auto", messages=[{"role": "user", "content": "q=0.9,0.50,0.70,0.72"}], stream=True
        ) as streamed:
            route = streamed.headers["x-switchyard-route"]
            text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    assert close.headers["x-switchyard-model"] == "m-small"
    assert close.headers["x-switchyard-route"] == "auto:value(small=0.700,best=commercial:0.740,tol=0.050)->small"
    assert close.headers["x-switchyard-score"] == "0.2000"
    assert close.parse().choices[0].message.content.startswith("small")
    assert far.headers["x-switchyard-route"] == "auto:value(large=0.700,best=commercial:0.720,tol=0.050)->large"
    assert far.parse().choices[0].message.content.startswith("large")
    assert strict.headers["x-switchyard-model"] == "m-commercial"
    assert strict.headers["x-switchyard-route"].startswith(
        "auto:value(commercial=0.720,best=commercial:0.720,tol=0.010)(max)"
    )
    assert loose.headers["x-switchyard-model"] == "m-small"
    assert route == far.headers["x-switchyard-route"] and text.startswith("large")
    decided = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in httpx.get(base + "/metrics").text.splitlines()
        if line.startswith("switchyard_route_decisions_total{")
    }
    assert decided == {
        'switchyard_route_decisions_total{reason="value",tier="small"}': 2.0,
        'switchyard_route_decisions_total{reason="value",tier="large"}': 2.0,
        'switchyard_route_decisions_total{reason="value",tier="commercial"}': 1.0,
    }


def test_the_shipped_artifact_predicts_each_tier(upstreams, thresholds):
    """No stand-in: with no artifact named, the proxy loads the shipped one that predicts quality and
    routes by its predictions."""
    stack, urls = upstreams
    url = stack.enter_context(serve_in_thread(create_app(_settings(urls, thresholds)))) + "/v1"
    prompts = [
        "hi",
        "Write a Python function that parses an ISO 8601 duration such as P3DT4H and returns seconds.",
        "Q: A farmer has 17 sheep; all but 9 run away. How many are left? Answer with a number.",
    ]
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        routes = [_ask(sdk, prompt).headers["x-switchyard-route"] for prompt in prompts]
    rows = ComplexityClassifier.load(BY_VALUE_ARTIFACT).score_with_quality(prompts, list(LLMROUTER.values()))
    for route, row in zip(routes, rows, strict=True):
        qualities = dict(zip(TIERS, row[1:], strict=True))
        best = max(TIERS, key=lambda t: (qualities[t], -TIERS.index(t)))
        chosen = next(t for t in TIERS if qualities[t] >= qualities[best] - 0.05)  # prices ascend with the tiers
        assert route == (
            f"auto:value({chosen}={qualities[chosen]:.3f},best={best}:{qualities[best]:.3f},tol=0.050)->{chosen}"
        )


def test_what_cannot_route_by_value_stops_the_start(upstreams, tmp_path, thresholds):
    _, urls = upstreams
    with pytest.raises(ThresholdsError, match="predicts no quality for 'gpt-5'"):
        create_app(_settings(urls, None, quality_models={**LLMROUTER, "large": "gpt-5"}))
    with pytest.raises(ThresholdsError, match="needs a head that predicts each model's quality"):
        create_app(_settings(urls, None, quality_models=LLMROUTER, classifier_artifact=str(STATIC_ARTIFACT)))
    two = tmp_path / "two.yaml"
    write_by_value(two, {"quality_models": {"small": "a", "large": "b"}, "tolerance": 0.05})
    with pytest.raises(ThresholdsError, match="routing.by_value names tiers small, large"):
        create_app(_settings(urls, two))
    raw = yaml.safe_load(thresholds.read_text())
    raw["routing"]["by_value"]["tolerance"] = 2
    thresholds.write_text(yaml.safe_dump(raw))
    with pytest.raises(ThresholdsError, match="by_value.tolerance"):
        create_app(_settings(urls, thresholds))
