"""model="auto" through the proxy and the `openai` SDK: the route is explained on every response."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread


@pytest.fixture
def auto_proxy(tmp_path):
    """Two fake upstreams as tiers small and large; the classifier replaced by a scorer that reads
    the score out of the prompt, so the route is known in advance."""
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",))),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        thresholds = tmp_path / "thresholds.yaml"
        thresholds.write_text(
            "version: 1\nrouting:\n  router: classifier\n  threshold: 0.45\n  modes:\n    max: {threshold: 0.1}\n"
        )
        settings = Settings(
            models=[{"name": f"m-{tier}", "base_url": url, "tier": tier} for tier, url in urls.items()],
            routing={
                "thresholds_file": thresholds,
                "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
            },
            upstream={"health_timeout_s": 30},  # a probe late on a busy machine must not take a tier out of the routes
        )

        def score_batch(texts):
            return np.array([float(t.rsplit("=", 1)[-1]) for t in texts])

        url = stack.enter_context(serve_in_thread(create_app(settings, score_batch=score_batch)))
        yield url + "/v1", states


def _ask(sdk, score: float, **kwargs):
    return sdk.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": f"score={score}"}], **kwargs
    )


def test_auto_picks_the_tier_and_says_why(auto_proxy):
    url, states = auto_proxy
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        low, high = _ask(sdk, 0.31), _ask(sdk, 0.62)
    assert low.headers["x-switchyard-model"] == "m-small"
    assert low.headers["x-switchyard-route"] == "auto:classifier=0.310<0.450->small"
    assert low.headers["x-switchyard-score"] == "0.3100"
    assert low.parse().choices[0].message.content.startswith("small")
    assert high.headers["x-switchyard-model"] == "m-large"
    assert high.headers["x-switchyard-route"] == "auto:classifier=0.620>=0.450->large"
    assert states["large"].records[-1].body["model"] == "m-large"


def test_stream_headers_say_the_same(auto_proxy):
    url, _ = auto_proxy
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        with sdk.chat.completions.with_streaming_response.create(
            model="auto", messages=[{"role": "user", "content": "score=0.9"}], stream=True
        ) as response:
            assert response.headers["x-switchyard-model"] == "m-large"
            assert response.headers["x-switchyard-route"] == "auto:classifier=0.900>=0.450->large"
            assert response.headers["x-switchyard-score"] == "0.9000"
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text.startswith("large")


def test_quality_header_and_explicit_names(auto_proxy):
    url, states = auto_proxy
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        strict = _ask(sdk, 0.2, extra_headers={"x-switchyard-quality": "max"})
        explicit = sdk.chat.completions.with_raw_response.create(
            model="m-small", messages=[{"role": "user", "content": "score=0.99"}]
        )
        with pytest.raises(openai.BadRequestError) as info:
            _ask(sdk, 0.2, extra_headers={"x-switchyard-quality": "cheapest"})
    assert strict.headers["x-switchyard-model"] == "m-large"
    assert strict.headers["x-switchyard-route"] == "auto:classifier=0.200>=0.100(max)->large"
    assert explicit.headers["x-switchyard-model"] == "m-small"
    assert "x-switchyard-route" not in explicit.headers
    assert info.value.response.json()["error"]["param"] == "x-switchyard-quality"


def test_auto_without_tiers_is_a_clear_404(client):
    with pytest.raises(openai.NotFoundError, match="routing.auto.tiers"):
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])


def test_a_thresholds_file_for_another_router_stops_the_start(tmp_path):
    from switchyard.core.thresholds import ThresholdsError

    path = tmp_path / "t.yaml"
    path.write_text("version: 1\nrouting: {router: length, threshold: 0.4}\n")
    settings = Settings(
        models=[
            {"name": "a", "base_url": "http://127.0.0.1:1/v1", "tier": "small"},
            {"name": "b", "base_url": "http://127.0.0.1:1/v1", "tier": "large"},
        ],
        routing={"thresholds_file": path, "auto": {"tiers": ["small", "large"]}},
    )
    with pytest.raises(ThresholdsError, match="router 'length'"):
        create_app(settings)


def test_thresholds_picked_for_another_artifact_stop_the_start():
    from switchyard.classifier.model import ARTIFACTS, DEFAULT_ARTIFACT
    from switchyard.core.thresholds import ThresholdsError
    from switchyard.gateway.services import check_startup

    models = [
        {"name": "a", "base_url": "http://127.0.0.1:1/v1", "tier": "small"},
        {"name": "b", "base_url": "http://127.0.0.1:1/v1", "tier": "large"},
    ]
    other = next(p for p in sorted(ARTIFACTS.iterdir()) if p != DEFAULT_ARTIFACT)
    mismatched = {"thresholds_file": other / "thresholds.yaml", "auto": {"tiers": ["small", "large"]}}
    with pytest.raises(ThresholdsError, match=f"classifier_artifact to {other}"):
        create_app(Settings(models=models, routing=mismatched))
    matched = {**mismatched, "auto": {"tiers": ["small", "large"], "classifier_artifact": other}}
    assert check_startup(Settings(models=models, routing=matched)).auto_thresholds
    default = {"thresholds_file": DEFAULT_ARTIFACT / "thresholds.yaml", "auto": {"tiers": ["small", "large"]}}
    assert check_startup(Settings(models=models, routing=default)).auto_thresholds
