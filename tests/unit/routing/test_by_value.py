"""Routing among N tiers by value: the rule, where its settings come from, and the router using it."""

from __future__ import annotations

import numpy as np
import pytest

from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.billing.teams import Team
from switchyard.classifier.by_value import DEFAULT_TOLERANCES, ValueRule, pick_by_value
from switchyard.classifier.runtime import MicroBatcher
from switchyard.core.capabilities import needs
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.prices import Price
from switchyard.core.thresholds import ThresholdsFile
from switchyard.gateway.auto_router import AutoRouter, resolve_thresholds, resolve_value_rule
from tests.unit.routing.test_auto_router import StubBackend

TIERS = ["small", "large", "commercial"]


@pytest.mark.parametrize(
    ("qualities", "costs", "tolerance", "chosen", "best"),
    [
        ((0.70, 0.73, 0.74), (1, 5, 20), 0.05, 0, 2),  # the cheapest is close enough
        ((0.50, 0.70, 0.72), (1, 5, 20), 0.05, 1, 2),  # the cheapest is not; the next is
        ((0.50, 0.70, 0.72), (1, 5, 20), 0.01, 2, 2),  # a strict tolerance: the best
        ((0.50, 0.70, 0.72), (1, 5, 20), 0.30, 0, 2),  # a loose one: the cheapest
        ((0.80, 0.70, 0.60), (1, 5, 20), 0.0, 0, 0),  # the cheapest is the best
        ((0.70, 0.73, 0.74), (9, 5, 20), 0.05, 1, 2),  # price decides among the close ones, not the order
        ((0.70, 0.74, 0.74), (0, 0, 0), 0.0, 1, 1),  # equal cost and quality: the lower tier
        ((0.70, 0.72, 0.74), (1, 5, 5), 0.03, 2, 2),  # equal cost: the better predicted, not the lower
    ],
)
def test_the_cheapest_tier_within_the_tolerance_of_the_best(qualities, costs, tolerance, chosen, best):
    pick = pick_by_value(qualities, costs, tolerance)
    assert (pick.chosen, pick.best) == (chosen, best)


def test_the_margin_is_how_near_a_tier_came_to_the_floor():
    assert pick_by_value((0.70, 0.73, 0.74), (1, 2, 3), 0.05).margin == pytest.approx(0.01)
    with pytest.raises(ValueError, match="2 qualities for 3 tiers"):
        pick_by_value((0.1, 0.2), (1, 2, 3), 0.05)


def _file(routing: dict) -> ThresholdsFile:
    return ThresholdsFile.model_validate({"version": 1, "routing": routing})


def test_the_rule_comes_from_the_config_else_the_thresholds_file():
    models = {"small": "m1", "large": "m2", "commercial": "m3"}
    assert resolve_value_rule(TIERS, None, None, None) is None
    assert resolve_value_rule(TIERS, None, None, _file({"router": "classifier", "threshold": 0.4})) is None
    rule = resolve_value_rule(TIERS, models, {"max": 0.001}, None)
    assert rule == ValueRule(("m1", "m2", "m3"), {**DEFAULT_TOLERANCES, "max": 0.001})
    by_file = _file(
        {"by_value": {"quality_models": models, "tolerance": 0.03, "modes": {"economy": {"tolerance": 0.2}}}}
    )
    rule = resolve_value_rule(TIERS, None, None, by_file)
    assert rule is not None and rule.quality_models == ("m1", "m2", "m3")
    assert (rule.tolerance("balanced"), rule.tolerance("economy"), rule.tolerance("max")) == (0.03, 0.2, 0.02)
    # the config's tolerance wins over the file's
    assert resolve_value_rule(TIERS, None, {"balanced": 0.07}, by_file).tolerance("balanced") == 0.07
    with pytest.raises(ValueError, match="names tiers small, large, commercial; routing.auto.tiers are a, b"):
        resolve_value_rule(["a", "b"], None, None, by_file)
    # a file with only routing.by_value has no thresholds: the config's (or even steps) apply
    assert resolve_thresholds(TIERS, None, by_file) == {"balanced": [1 / 3, 2 / 3]}


def _router(qualities: dict[str, tuple[float, ...]], prices: dict[str, Price] | None = None) -> AutoRouter:
    """Tiers small < large < commercial; the scorer reads each prompt's row out of `qualities`."""

    def score_batch(texts):
        return np.array([(0.5, *qualities[text]) for text in texts])

    registry = ModelRegistry([ModelEntry(f"m-{t}", StubBackend(f"m-{t}"), "test", t, None) for t in TIERS])
    return AutoRouter(
        registry,
        TIERS,
        {},
        MicroBatcher(score_batch, max_wait_ms=1),
        default_tier="small",
        deadline_ms=30_000,
        prices=prices,
        value=ValueRule(("q1", "q2", "q3"), {"balanced": 0.05, "economy": 0.25, "max": 0.01}),
    )


def _request(text: str, **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.from_payload(
        {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}
    )


async def test_the_router_goes_by_value_and_says_so():
    router = _router({"near": (0.70, 0.73, 0.74), "far": (0.50, 0.70, 0.72)})
    near = await router.route(_request("near"), None, None, None, {})
    assert near.entry.name == "m-small"
    assert near.reason == "auto:value(small=0.700,best=commercial:0.740,tol=0.050)->small"
    assert near.score == 0.5 and near.kind == "value" and near.margin == pytest.approx(0.01)
    far = await router.route(_request("far"), None, None, None, {})
    assert far.reason == "auto:value(large=0.700,best=commercial:0.720,tol=0.050)->large"
    strict = await router.route(_request("far"), "max", None, None, {})
    assert strict.reason == "auto:value(commercial=0.720,best=commercial:0.720,tol=0.010)(max)->commercial"
    loose = await router.route(_request("far"), "economy", None, None, {})
    assert loose.entry.name == "m-small"


async def test_the_price_of_the_request_on_each_tier_decides():
    prices = {"m-small": Price(10.0, 10.0), "m-large": Price(1.0, 1.0), "m-commercial": Price(30.0, 60.0)}
    router = _router({"p": (0.70, 0.73, 0.74)}, prices)
    decision = await router.route(_request("p"), None, None, None, {})
    assert decision.entry.name == "m-large"  # within the tolerance too, and cheaper than small


async def test_without_every_tiers_price_the_order_is_the_price():
    # small is dearer than large, but commercial has no price: the tiers' order decides
    prices = {"m-small": Price(10.0, 10.0), "m-large": Price(1.0, 1.0)}
    decision = await _router({"p": (0.70, 0.73, 0.74)}, prices).route(_request("p"), None, None, None, {})
    assert decision.entry.name == "m-small"


async def test_constraints_still_apply_after_the_pick():
    router = _router({"far": (0.50, 0.70, 0.72)})
    team = Team("t", frozenset({"m-small", "m-commercial"}), None)
    moved = await router.route(_request("far"), None, team, None, {})
    assert moved.reason == "auto:value(large=0.700,best=commercial:0.720,tol=0.050)->small(large not allowed)"
    request = _request("far", tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert needs(request)  # tools: the stub tiers can all call them, so nothing moves
    same = await router.route(request, None, None, None, needs(request))
    assert same.entry.name == "m-large"


async def test_the_batcher_keeps_whole_rows():
    calls: list[list[str]] = []

    def score_batch(texts):
        calls.append(texts)
        return np.array([(0.25, 0.5, 0.75) for _ in texts])

    batcher = MicroBatcher(score_batch)
    assert await batcher.scores("a", 30) == (0.25, 0.5, 0.75)
    assert await batcher.score("a", 30) == 0.25  # from the cache: the first value of the row
    assert calls == [["a"]]
    batcher.close()
