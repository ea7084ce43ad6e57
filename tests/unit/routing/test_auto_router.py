from __future__ import annotations

import numpy as np
import pytest

from backends.base import BackendHealth
from classifier.runtime import MicroBatcher
from proxy.errors import InvalidRequest
from proxy.protocol import ChatCompletionRequest
from proxy.registry import ModelEntry, ModelRegistry
from proxy.routing import AutoRouter, resolve_thresholds, routing_text


class StubBackend:
    """Only readiness matters to routing."""

    def __init__(self, name: str, ready: bool = True, saturated: bool = False) -> None:
        self.name, self.ready, self.saturated = name, ready, saturated

    def is_ready(self) -> bool:
        return self.ready

    def is_saturated(self) -> bool:
        return self.saturated

    async def health(self) -> BackendHealth:
        return BackendHealth(self.ready)


def _registry(windows=(None, None, None)) -> ModelRegistry:
    tiers = ("small", "large", "commercial")
    return ModelRegistry(
        [ModelEntry(f"m-{t}", StubBackend(f"m-{t}"), "test", t, w) for t, w in zip(tiers, windows, strict=True)]
    )


def _router(registry, score_of=lambda text: float(text.split("=")[-1]), delay_s=0.0, thresholds=None):
    def score_batch(texts):
        if delay_s:
            import time

            time.sleep(delay_s)
        return np.array([score_of(t) for t in texts])

    modes = thresholds or {"balanced": [0.3, 0.7], "economy": [0.5, 0.9], "max": [0.1, 0.4]}
    return AutoRouter(
        registry,
        ["small", "large", "commercial"],
        modes,
        MicroBatcher(score_batch, max_wait_ms=1),
        default_tier="small",
        deadline_ms=50,
    )


def _request(score: float, **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.from_payload(
        {"model": "auto", "messages": [{"role": "user", "content": f"score={score}"}], **extra}
    )


@pytest.mark.parametrize(
    ("score", "tier", "reason"),
    [
        (0.29, "small", "auto:classifier=0.290<0.300->small"),
        (0.30, "large", "auto:classifier=0.300<0.700->large"),
        (0.69, "large", "auto:classifier=0.690<0.700->large"),
        (0.70, "commercial", "auto:classifier=0.700>=0.700->commercial"),
    ],
)
async def test_scores_either_side_of_each_threshold(score, tier, reason):
    decision = await _router(_registry()).route(_request(score), None)
    assert decision.entry.tier == tier
    assert decision.reason == reason
    assert decision.score == pytest.approx(score)


async def test_quality_modes_pick_their_threshold_set():
    router = _router(_registry())
    assert (await router.route(_request(0.45), "economy")).entry.tier == "small"
    assert (await router.route(_request(0.45), "max")).entry.tier == "commercial"
    assert (await router.route(_request(0.45), "max")).reason.endswith("(max)->commercial")
    with pytest.raises(InvalidRequest, match="economy, balanced, max"):
        await router.route(_request(0.45), "cheap")


async def test_a_late_classifier_routes_by_default_and_says_so():
    decision = await _router(_registry(), delay_s=0.2).route(_request(0.9), None)
    assert decision.entry.tier == "small"
    assert decision.reason == "auto:classifier late (>50ms)->small"
    assert decision.score is None


async def test_context_window_skips_upward():
    registry = _registry(windows=(64, 4096, None))
    decision = await _router(registry).route(_request(0.1, max_tokens=200), None)
    assert decision.entry.tier == "large"
    assert "(context>small)" in decision.reason
    with pytest.raises(InvalidRequest, match="can hold"):
        await _router(_registry(windows=(64, 64, 64))).route(_request(0.1, max_tokens=200), None)


async def test_an_unready_or_saturated_tier_degrades_first():
    registry = _registry()
    registry.get("m-large").backend.ready = False
    decision = await _router(registry).route(_request(0.5), None)
    assert decision.entry.tier == "small"
    assert decision.reason.endswith("->small(large busy or down)")
    registry.get("m-small").backend.saturated = True
    decision = await _router(registry).route(_request(0.5), None)
    assert decision.entry.tier == "commercial"


def test_routing_text_is_system_plus_last_user_turn():
    request = ChatCompletionRequest.from_payload(
        {
            "model": "auto",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "second"},
            ],
        }
    )
    assert routing_text(request) == "Be brief.\nsecond"


def test_thresholds_resolution():
    file = {"routing": {"router": "classifier", "threshold": 0.4, "modes": {"max": {"threshold": 0.2}}}}
    assert resolve_thresholds(["s", "l"], None, file) == {"balanced": [0.4], "max": [0.2]}
    assert resolve_thresholds(["s", "l", "c"], None, None) == {"balanced": [1 / 3, 2 / 3]}
    with pytest.raises(ValueError, match="router 'length'"):
        resolve_thresholds(["s", "l"], None, {"routing": {"router": "length", "threshold": 0.4}})
    with pytest.raises(ValueError, match="need 2, ascending"):
        resolve_thresholds(["s", "l", "c"], [0.7, 0.3], None)
