"""Capabilities in every place that picks a model: `auto`, the cascade's plan, fallbacks, `degrade_to`."""

from __future__ import annotations

import numpy as np
import pytest

from switchyard.backends.base import Backend, BackendHealth
from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.backends.resilience import ResiliencePolicy, ResilientExecutor
from switchyard.billing.teams import Team
from switchyard.cascade.runtime import Cascade, CascadePolicy, Plan, Rung
from switchyard.cascade.thrash import ThrashGuard, ThrashPolicy
from switchyard.classifier.runtime import MicroBatcher
from switchyard.core.capabilities import Capabilities, needs
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import UnsupportedParameter
from switchyard.core.prices import Price
from switchyard.gateway.auto_router import AutoRouter
from switchyard.gateway.saturation import SaturationGate


async def _route(router, request, quality=None, team=None, headroom_usd=None):
    """The router's decision, given what the request needs (as the relay works it out, once)."""
    return await router.route(request, quality, team, headroom_usd, needs(request))


def _plan(cascade, start, request, mode=None, near_threshold=False, ctx=None):
    """The cascade's plan, given what the request needs (as the relay works it out, once)."""
    return cascade.plan(start, request, mode, near_threshold, ctx, needed=needs(request))


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
NO_TOOLS = Capabilities(tools=False)


class StubBackend(Backend):
    """Never called: only what routing reads (readiness, saturation, capabilities) is real."""

    def __init__(self, name: str, capabilities: Capabilities | None = None, saturated: bool = False) -> None:
        self.name, self.reported, self.saturated = name, capabilities or Capabilities(), saturated

    async def complete(self, request, pick=None):
        raise AssertionError("routing never calls a backend")

    def stream(self, request, pick=None):
        raise AssertionError("routing never calls a backend")

    async def health(self) -> BackendHealth:
        return BackendHealth(True)

    def is_ready(self) -> bool:
        return True

    def is_saturated(self) -> bool:
        return self.saturated

    async def aclose(self) -> None:
        pass

    def capabilities(self) -> Capabilities:
        return self.reported


def _entry(name: str, tier: str | None = None, capabilities: Capabilities | None = None, **config) -> ModelEntry:
    return ModelEntry(name, StubBackend(name, capabilities), "test", tier, None, capability_overrides=config)


def _registry(*entries: ModelEntry) -> ModelRegistry:
    return ModelRegistry(list(entries))


def _request(score: float = 0.5, **extra) -> ChatCompletionRequest:
    return ChatCompletionRequest.from_payload(
        {"model": "auto", "messages": [{"role": "user", "content": f"score={score}"}], **extra}
    )


def _router(registry: ModelRegistry) -> AutoRouter:
    return AutoRouter(
        registry,
        ["small", "large", "commercial"],
        {"balanced": [0.3, 0.7]},
        MicroBatcher(lambda texts: np.array([float(t.split("=")[-1]) for t in texts]), max_wait_ms=1),
        default_tier="small",
        deadline_ms=30_000,  # generous: the classifier answers in time however busy the machine
    )


def _tiers(small=None, large=None, commercial=None) -> ModelRegistry:
    return _registry(
        _entry("m-small", "small", small),
        _entry("m-large", "large", large),
        _entry("m-commercial", "commercial", commercial),
    )


# -- auto ----------------------------------------------------------------------------------------


async def test_a_tier_that_lacks_a_capability_gives_way_upward_first():
    router = _router(_tiers(small=NO_TOOLS, large=NO_TOOLS))
    decision = await _route(router, _request(0.1, tools=TOOLS), None)
    assert decision.entry.name == "m-commercial"
    assert decision.reason == "auto:classifier=0.100<0.300->commercial(small lacks tools)"
    assert (await _route(router, _request(0.1), None)).entry.name == "m-small"  # no tools: as before


async def test_at_the_top_it_gives_way_downward():
    router = _router(_tiers(commercial=Capabilities(json_schema=False)))
    decision = await _route(router, _request(0.9, response_format=SCHEMA), None)
    assert decision.entry.name == "m-large"
    assert decision.reason.endswith("->large(commercial lacks json_schema)")


async def test_no_tier_that_can_is_a_400_naming_the_chosen_tiers_parameter():
    router = _router(_tiers(small=NO_TOOLS, large=NO_TOOLS, commercial=NO_TOOLS))
    with pytest.raises(UnsupportedParameter) as caught:
        await _route(router, _request(0.5, tool_choice="required", tools=TOOLS), None)
    assert caught.value.param == "tools" and caught.value.status_code == 400
    assert caught.value.message.startswith("No model that model='auto' may pick")
    assert "m-large lacks tools; m-commercial lacks tools; m-small lacks tools" in caught.value.message


async def test_within_a_tier_only_a_model_that_can_is_used():
    registry = _registry(
        _entry("m-small", "small", NO_TOOLS),
        _entry("m-small-tools", "small"),
        _entry("m-large", "large"),
        _entry("m-commercial", "commercial"),
    )
    decision = await _route(_router(registry), _request(0.1, tools=TOOLS), None)
    assert decision.entry.name == "m-small-tools"
    assert decision.reason.endswith("->small")


async def test_a_configured_override_decides_over_the_backends_report():
    registry = _registry(
        _entry("m-small", "small", NO_TOOLS, tools=True),
        _entry("m-large", "large", vision=False),
        _entry("m-c", "commercial"),
    )
    router = _router(registry)
    assert (await _route(router, _request(0.1, tools=TOOLS), None)).entry.name == "m-small"
    image = [{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "score=0.5"}]
    request = ChatCompletionRequest.from_payload({"model": "auto", "messages": [{"role": "user", "content": image}]})
    assert (await _route(router, request, None)).entry.name == "m-c"


async def test_the_context_window_a_backend_reports_counts():
    registry = _tiers(small=Capabilities(context_window=64))
    decision = await _route(_router(registry), _request(0.1, max_tokens=200), None)
    assert decision.entry.name == "m-large"
    assert "(context>small)" in decision.reason


async def test_budget_headroom_never_moves_to_a_tier_that_cannot():
    router = _router(_tiers(small=NO_TOOLS))
    router.prices = {"m-small": Price(1.0, 1.0), "m-large": Price(10.0, 10.0), "m-commercial": Price(100.0, 100.0)}
    decision = await _route(router, _request(0.9, tools=TOOLS, max_tokens=100), None, headroom_usd=1e-9)
    assert decision.entry.name == "m-large"  # the lowest tier that can, not m-small
    assert decision.reason.endswith("(commercial over budget)")


async def test_the_team_step_comes_first():
    router = _router(_tiers(small=NO_TOOLS))
    team = Team("t", frozenset({"m-small", "m-commercial"}))
    decision = await _route(router, _request(0.5, tools=TOOLS), None, team)
    # large is not allowed: down to small, which lacks tools: up to commercial
    assert decision.entry.name == "m-commercial"
    assert decision.reason.endswith("->commercial(large not allowed)(small lacks tools)")


# -- fallbacks and degrade_to --------------------------------------------------------------------


def test_fallbacks_that_cannot_serve_the_request_are_left_out_of_the_chain():
    registry = _registry(_entry("a"), _entry("b", capabilities=NO_TOOLS), _entry("c"))
    executor = ResilientExecutor(registry, {"a": ["b", "c"]}, ResiliencePolicy())
    first = registry.get("a")
    assert [e.name for e in executor.chain(first, None, {"tools": "tools"})] == ["a", "c"]
    assert [e.name for e in executor.chain(first, None, {})] == ["a", "b", "c"]


async def test_degrade_to_only_a_model_that_can():
    registry = _registry(_entry("big"), _entry("small", capabilities=NO_TOOLS))
    registry.get("big").backend.saturated = True
    gate = SaturationGate(registry, {"big": "small"})
    refused = await gate.admit(registry.get("big"), "best-effort", None, {"tools": "tools"})
    degraded = await gate.admit(registry.get("big"), "best-effort", None, {})
    assert refused.entry.name == "big" and not refused.is_degraded
    assert degraded.entry.name == "small" and degraded.is_degraded
    assert gate.num_degraded == 1


# -- the cascade's plan --------------------------------------------------------------------------


def _cascade(*entries: ModelEntry) -> Cascade:
    rungs = [Rung(entry, None, -0.5) for entry in entries]  # plan() never scores
    return Cascade(rungs, CascadePolicy(), None, ThrashGuard(ThrashPolicy()))


def test_the_plan_passes_over_a_rung_that_cannot_and_says_so():
    cascade = _cascade(_entry("s"), _entry("m", capabilities=Capabilities(json_schema=False)), _entry("l"))
    plan = _plan(cascade, cascade.rungs[0].entry, _request(response_format=SCHEMA), None)
    assert isinstance(plan, Plan)
    assert [r.entry.name for r in plan.rungs] == ["s", "l"]
    assert plan.passed_over == ["(m lacks json_schema)"] and not plan.is_moved_up
    plan.steps.append("l")
    assert cascade._header(plan) == "l(m lacks json_schema)"
    plain = _plan(cascade, cascade.rungs[0].entry, _request(), None)
    assert [r.entry.name for r in plain.rungs] == ["s", "m", "l"] and plain.passed_over == []


def test_only_the_clients_logprobs_pass_a_rung_over():
    cascade = _cascade(_entry("s"), _entry("l", capabilities=Capabilities(logprobs=False)))
    judged = _plan(cascade, cascade.rungs[0].entry, _request(), None)
    assert [r.entry.name for r in judged.rungs] == ["s", "l"]  # the cascade's own logprobs: not a need
    asked = _plan(cascade, cascade.rungs[0].entry, _request(logprobs=True), None)
    assert [r.entry.name for r in asked.rungs] == ["s"]
    assert asked.needed == {"logprobs": "logprobs"}


def test_where_the_cascade_starts_and_when_no_rung_can():
    cascade = _cascade(_entry("s", capabilities=NO_TOOLS), _entry("l"))
    assert cascade.first_capable({}) == (cascade.rungs[0].entry, [])
    assert cascade.first_capable({"tools": "tools"}) == (cascade.rungs[1].entry, ["(s lacks tools)"])
    with pytest.raises(UnsupportedParameter) as caught:
        _cascade(_entry("s", capabilities=NO_TOOLS)).first_capable({"tools": "tool_choice"})
    assert caught.value.param == "tool_choice"
    vision = Capabilities(vision=False)
    blind = _cascade(_entry("s", capabilities=vision), _entry("l", capabilities=vision))
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    with pytest.raises(UnsupportedParameter, match="the cascade"):
        _plan(
            blind,
            blind.rungs[0].entry,
            ChatCompletionRequest.from_payload({"model": "cascade", "messages": [image]}),
            None,
        )


def test_an_entrys_capabilities_follow_what_its_backend_reports_with_the_overrides_kept():
    entry = _entry("m", capabilities=NO_TOOLS, vision=False)
    entry.context_window = 4096
    assert (entry.capabilities.tools, entry.capabilities.vision, entry.capabilities.context_window) == (
        False,
        False,
        4096,
    )
    assert entry.capabilities is entry.capabilities  # not rebuilt while the report stays the same
    entry.backend.reported = Capabilities(tools=True)  # an embedded model that has loaded its template
    assert (entry.capabilities.tools, entry.capabilities.vision, entry.capabilities.context_window) == (
        True,
        False,
        4096,
    )
