from __future__ import annotations

import threading

import numpy as np
import pytest

from switchyard.backends.base import BackendHealth
from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.classifier.runtime import MicroBatcher
from switchyard.core.capabilities import Capabilities, needs
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import InvalidRequest
from switchyard.core.prices import Price
from switchyard.core.thresholds import ThresholdsFile
from switchyard.gateway.auto_router import AutoRouter, resolve_thresholds, routing_text


async def _route(router, request, quality=None, team=None, headroom_usd=None):
    """The router's decision, given what the request needs (as the relay works it out, once)."""
    return await router.route(request, quality, team, headroom_usd, needs(request))


class StubBackend:
    """Only readiness, saturation and capabilities matter to routing."""

    def __init__(
        self, name: str, ready: bool = True, saturated: bool = False, capabilities: Capabilities | None = None
    ) -> None:
        self.name, self.ready, self.saturated = name, ready, saturated
        self.reported = capabilities or Capabilities()

    def capabilities(self) -> Capabilities:
        return self.reported

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


def _router(
    registry,
    score_of=lambda text: float(text.split("=")[-1]),
    gate: threading.Event | None = None,
    thresholds=None,
    deadline_ms: float = 30_000,  # generous: the classifier answers in time however busy the machine
):
    def score_batch(texts):
        if gate is not None:  # the classifier answers only once the test opens the gate
            gate.wait(30)
        return np.array([score_of(t) for t in texts])

    modes = thresholds or {"balanced": [0.3, 0.7], "economy": [0.5, 0.9], "max": [0.1, 0.4]}
    return AutoRouter(
        registry,
        ["small", "large", "commercial"],
        modes,
        MicroBatcher(score_batch, max_wait_ms=1),
        default_tier="small",
        deadline_ms=deadline_ms,
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
    decision = await _route(_router(_registry()), _request(score), None)
    assert decision.entry.tier == tier
    assert decision.reason == reason
    assert decision.score == pytest.approx(score)


async def test_quality_modes_pick_their_threshold_set():
    router = _router(_registry())
    assert (await _route(router, _request(0.45), "economy")).entry.tier == "small"
    assert (await _route(router, _request(0.45), "max")).entry.tier == "commercial"
    assert (await _route(router, _request(0.45), "max")).reason.endswith("(max)->commercial")
    with pytest.raises(InvalidRequest, match="economy, balanced, max"):
        await _route(router, _request(0.45), "cheap")


async def test_a_late_classifier_routes_by_default_and_says_so():
    gate = threading.Event()  # late for sure: it answers only after the routing decision
    try:
        decision = await _route(_router(_registry(), gate=gate, deadline_ms=50), _request(0.9), None)
    finally:
        gate.set()
    assert decision.entry.tier == "small"
    assert decision.reason == "auto:classifier late (>50ms)->small"
    assert decision.score is None


async def test_context_window_skips_upward():
    registry = _registry(windows=(64, 4096, None))
    decision = await _route(_router(registry), _request(0.1, max_tokens=200), None)
    assert decision.entry.tier == "large"
    assert "(context>small)" in decision.reason
    with pytest.raises(InvalidRequest, match="can hold"):
        await _route(_router(_registry(windows=(64, 64, 64))), _request(0.1, max_tokens=200), None)


async def test_an_unready_or_saturated_tier_degrades_first():
    registry = _registry()
    registry.get("m-large").backend.ready = False
    decision = await _route(_router(registry), _request(0.5), None)
    assert decision.entry.tier == "small"
    assert decision.reason.endswith("->small(large busy or down)")
    registry.get("m-small").backend.saturated = True
    decision = await _route(_router(registry), _request(0.5), None)
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
    assert routing_text(request, include_system=False) == "second"


async def test_router_reads_the_system_prompt_only_when_set_to():
    seen: list[str] = []

    def score_batch(texts):
        seen.extend(texts)
        return np.full(len(texts), 0.5)

    request = ChatCompletionRequest.from_payload(
        {"model": "auto", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    )
    for read_system_prompt in (True, False):
        router = AutoRouter(
            _registry(),
            ["small", "large", "commercial"],
            {"balanced": [0.3, 0.7]},
            MicroBatcher(score_batch),
            default_tier="small",
            deadline_ms=30_000,
            read_system_prompt=read_system_prompt,
        )
        await _route(router, request)
        router.scorer.close()
    assert seen == ["Be brief.\nhi", "hi"]


def test_thresholds_resolution():
    file = ThresholdsFile.model_validate(
        {"version": 1, "routing": {"router": "classifier", "threshold": 0.4, "modes": {"max": {"threshold": 0.2}}}}
    )
    assert resolve_thresholds(["s", "l"], None, file) == {"balanced": [0.4], "max": [0.2]}
    assert resolve_thresholds(["s", "l", "c"], None, None) == {"balanced": [1 / 3, 2 / 3]}
    with pytest.raises(ValueError, match="router 'length'"):
        other = ThresholdsFile.model_validate({"version": 1, "routing": {"router": "length", "threshold": 0.4}})
        resolve_thresholds(["s", "l"], None, other)
    with pytest.raises(ValueError, match="need 2, ascending"):
        resolve_thresholds(["s", "l", "c"], [0.7, 0.3], None)


# -- the team's models (step 3) and its budget headroom (step 6) ---------------------------------

PRICES = {"m-small": Price(1.0, 1.0), "m-large": Price(10.0, 10.0), "m-commercial": Price(100.0, 100.0)}


def _priced_router(registry=None):
    router = _router(registry or _registry())
    router.prices = PRICES
    return router


async def test_a_tier_the_team_may_not_use_gives_way_below_first_then_above():
    from switchyard.billing.teams import Team

    router = _priced_router()
    only_small = Team("t", frozenset({"m-small"}))
    decision = await _route(router, _request(0.9), None, only_small)
    assert decision.entry.name == "m-small"
    assert decision.reason == "auto:classifier=0.900>=0.700->small(commercial not allowed)"
    only_commercial = Team("t", frozenset({"m-commercial"}))
    decision = await _route(router, _request(0.1), None, only_commercial)
    assert decision.entry.name == "m-commercial"
    assert decision.reason.endswith("->commercial(small not allowed)")
    assert (await _route(router, _request(0.5), None, Team("all"))).entry.name == "m-large"


async def test_a_team_with_no_routable_model_is_refused():
    from switchyard.billing.teams import Team
    from switchyard.core.errors import ModelNotAllowed

    with pytest.raises(ModelNotAllowed, match="Team 'x' may use none of the models"):
        await _route(_priced_router(), _request(0.5), None, Team("x", frozenset()))


async def test_budget_headroom_moves_down_to_the_nearest_tier_that_fits():
    router = _priced_router()
    # score=0.9 is 3 prompt tokens; with max_tokens 100: 103 tokens at $1 / $10 / $100 per million.
    request = _request(0.9, max_tokens=100)
    costs = {name: price.cost_usd(103, 0) for name, price in PRICES.items()}
    plenty = await _route(router, request, None, headroom_usd=1.0)
    assert plenty.entry.name == "m-commercial" and "budget" not in plenty.reason
    tight = await _route(router, request, None, headroom_usd=costs["m-large"] * 1.01)
    assert tight.entry.name == "m-large"
    assert tight.reason == "auto:classifier=0.900>=0.700->large(commercial over budget)"
    tighter = await _route(router, request, None, headroom_usd=costs["m-small"] * 1.01)
    assert tighter.entry.name == "m-small"
    nothing_fits = await _route(router, request, None, headroom_usd=costs["m-small"] / 2)
    assert nothing_fits.entry.name == "m-small"  # the cheapest usable tier: budgets are soft by one request
    at_bottom = await _route(router, _request(0.1, max_tokens=100), None, headroom_usd=0.0)
    assert at_bottom.entry.name == "m-small" and "budget" not in at_bottom.reason


async def test_the_budget_step_skips_unhealthy_tiers():
    registry = _registry()
    registry.get("m-large").backend.ready = False
    router = _priced_router(registry)
    request = _request(0.9, max_tokens=100)
    decision = await _route(router, request, None, headroom_usd=103 * 10.0 / 1e6 * 1.01)
    assert decision.entry.name == "m-small"
    assert decision.reason.endswith("->small(commercial over budget)")


async def test_without_max_tokens_the_estimate_assumes_a_typical_answer():
    from switchyard.core.estimates import ANSWER_TOKENS_FOR_COST, estimated_cost_usd

    assert estimated_cost_usd(_request(0.9), Price(0.0, 1e6)) == ANSWER_TOKENS_FOR_COST
    assert estimated_cost_usd(_request(0.9, max_tokens=7), Price(1e6, 1e6)) == 3 + 7
    assert estimated_cost_usd(_request(0.9), None) == 0.0
