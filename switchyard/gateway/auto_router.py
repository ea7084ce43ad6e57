"""`model="auto"`: score the prompt, pick a tier by threshold, then apply constraints in order.

Order of application (each step may move the request to another tier):

1. score: the classifier scores the system prompt plus the last user turn; late or failed, the
   configured default tier is used and the route says why;
2. thresholds: tiers ascend (e.g. small < t1 <= large < t2 <= commercial); the quality mode
   (`x-switchyard-quality: economy | balanced | max`) picks the threshold set. Or, routing by
   value (`routing.auto.quality_models`): the classifier predicts each tier's quality and the
   cheapest tier within the mode's tolerance of the best one is picked (classifier/by_value.py);
3. models the team may use (`teams.<name>.models`): only those are candidates; a tier with none
   gives way to the nearest tier below it that has one, else the nearest above;
4. capabilities: only models with every capability the request needs (tools, images, JSON
   schema…; `core.capabilities.needs`) are candidates; a tier with none gives way to the nearest
   tier above it that has one (a capability is a quality need: escalate, not degrade), else the
   nearest below; no tier at all: a 400 `unsupported_parameter`;
5. context window: a tier whose model cannot hold the prompt plus `max_tokens` is skipped upward;
6. health and saturation: a tier whose backend is not ready, or is saturated, gives way to the
   nearest tier below it that is ready, else the nearest above (degrading before escalating);
7. budget headroom (`teams.<name>.budget_usd_per_day`): when the request's estimated cost on the
   chosen model exceeds what the team may still spend today, the nearest tier below whose estimate
   fits answers, else the lowest usable tier. (A team with nothing left is refused before routing.)

The decision is explained in `x-switchyard-route` (ASCII, as headers must be), e.g.
`auto:classifier=0.31<0.45->small`, `auto:classifier=0.62>=0.45->small(large over budget)`,
`auto:classifier=0.10<0.45->large(small lacks tools)`, or by value (the chosen tier's predicted
quality, the best tier's, the tolerance) `auto:value(small=0.712,best=large:0.741,tol=0.050)->small`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.billing.teams import Team
from switchyard.classifier.by_value import DEFAULT_TOLERANCES, ValueRule, pick_by_value
from switchyard.classifier.runtime import MicroBatcher, ScoreUnavailable
from switchyard.core.capabilities import explain, unsupported_by_any
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.drift import DriftMonitor
from switchyard.core.errors import InvalidRequest, ModelNotAllowed, ModelNotFound
from switchyard.core.estimates import estimated_cost_usd, estimated_tokens, routing_text
from switchyard.core.metrics import Metrics
from switchyard.core.prices import Price
from switchyard.core.thresholds import ThresholdsFile
from switchyard.core.tracing import child_span

QUALITY_MODES = ("economy", "balanced", "max")


@dataclass(frozen=True, slots=True)
class RouteDecision:
    entry: ModelEntry
    reason: str
    score: float | None
    margin: float | None = None  # distance from the score to the nearest threshold
    kind: str = "score"  # bounded, for the metrics: how the tier was picked, or what moved it last


class AutoRouter:
    def __init__(
        self,
        registry: ModelRegistry,
        tiers: list[str],
        thresholds: dict[str, list[float]],
        scorer: MicroBatcher | None,
        *,
        router_name: str = "classifier",
        default_tier: str,
        deadline_ms: float,
        prices: dict[str, Price] | None = None,
        metrics: Metrics | None = None,
        read_system_prompt: bool = True,
        value: ValueRule | None = None,
        drift: DriftMonitor | None = None,
    ) -> None:
        self.registry = registry
        self.drift = drift  # counted scores go to its window
        self.value = value  # routing by value, else by the score's thresholds
        self.read_system_prompt = read_system_prompt
        self.tiers = tiers
        self.thresholds = thresholds  # quality mode -> ascending thresholds, len(tiers) - 1 each
        self.scorer = scorer
        self.metrics = metrics  # the app's
        self.router_name = router_name
        self.default_tier = default_tier
        self.deadline_s = deadline_ms / 1000
        self.prices = prices or {}  # model -> USD per million input, output tokens
        self.models_by_tier = {tier: [e for e in registry if e.tier == tier] for tier in tiers}
        missing = [tier for tier, entries in self.models_by_tier.items() if not entries]
        if missing:
            raise ValueError(f"routing.auto.tiers names tier(s) no model has: {', '.join(missing)}")
        # by value, each tier is priced as its first model (None: unpriced)
        self.tier_prices = [self.prices.get(self.models_by_tier[t][0].name) for t in tiers]

    async def route(
        self,
        request: ChatCompletionRequest | CompletionRequest,
        quality: str | None,
        team: Team | None,
        headroom_usd: float | None,
        needed: dict[str, str],
        *,
        is_counted: bool = True,
    ) -> RouteDecision:
        """`needed`: what the request needs of a model (`core.capabilities.needs`); `is_counted`:
        whether the metrics count the decision (not for a request that is only asked about)."""
        metrics = self.metrics if is_counted else None
        mode = quality or "balanced"
        if mode not in QUALITY_MODES:
            raise InvalidRequest(
                f"x-switchyard-quality must be one of {', '.join(QUALITY_MODES)}, not {quality!r}.",
                param="x-switchyard-quality",
            )
        thresholds = self.thresholds.get(mode) or self.thresholds.get("balanced", [])
        score = margin = None
        if self.scorer is None:
            index, reason, kind = self.tiers.index(self.default_tier), f"auto:no-{self.router_name}", "no-router"
        else:
            started_at = time.perf_counter()
            try:
                with child_span("classify", router=self.router_name) as span:
                    row = await self.scorer.scores(routing_text(request, self.read_system_prompt), self.deadline_s)
                    score = row[0]
                    if metrics is not None and self.drift is not None:
                        self.drift.observe_score(score)
                    if span is not None:
                        span.set_attribute("switchyard.score", score)
            except ScoreUnavailable as exc:
                index, reason, kind = self.tiers.index(self.default_tier), f"auto:{exc.reason}", "score-unavailable"
            else:
                if self.value is not None:
                    index, reason, margin = self._by_value(request, row[1:], self.value.tolerance(mode))
                    kind = "value"
                else:
                    index, kind = sum(score >= t for t in thresholds), "score"
                    reason = f"auto:{self.router_name}={score:.3f}" + (
                        f"<{thresholds[index]:.3f}" if index < len(thresholds) else f">={thresholds[-1]:.3f}"
                    )
                    if thresholds:
                        margin = min(abs(score - t) for t in thresholds)
                if mode != "balanced":
                    reason += f"({mode})"
            finally:
                if metrics is not None:
                    metrics.classifier_decision.observe(time.perf_counter() - started_at)
        entry, notes = self._constrain(index, request, team, headroom_usd, needed)
        kind = notes[-1][0] if notes else kind
        tier = entry.tier or ""  # always set: every candidate came from models_by_tier
        if metrics is not None:
            metrics.route_decided(tier, kind)
        return RouteDecision(entry, reason + "->" + tier + "".join(text for _, text in notes), score, margin, kind)

    def _by_value(self, request, qualities: tuple[float, ...], tolerance: float) -> tuple[int, str, float]:
        """The tier by value, the route's text and the decision's margin. A tier's cost is the
        request's estimate on its first model; when one has no price, the tiers' order is theirs."""
        if len(qualities) != len(self.tiers):
            raise ValueError(f"the scorer predicted {len(qualities)} qualities for {len(self.tiers)} tiers")
        if None in self.tier_prices:
            costs = [float(i) for i in range(len(self.tiers))]
        else:
            costs = [estimated_cost_usd(request, price) for price in self.tier_prices]
        pick = pick_by_value(qualities, costs, tolerance)
        chosen, best = self.tiers[pick.chosen], self.tiers[pick.best]
        reason = (
            f"auto:value({chosen}={qualities[pick.chosen]:.3f},best={best}:{qualities[pick.best]:.3f},"
            f"tol={tolerance:.3f})"
        )
        return pick.chosen, reason, pick.margin

    def strongest(self, team: Team | None) -> ModelEntry:
        """The model of the highest tier the team may use: what 'auto' could have reached at most."""
        for tier in reversed(self.tiers):
            for entry in self.models_by_tier[tier]:
                if team is None or team.may_use(entry.name):
                    return entry
        return self.models_by_tier[self.tiers[-1]][0]

    def _constrain(
        self, index: int, request, team: Team | None, headroom_usd: float | None, needed: dict[str, str]
    ) -> tuple[ModelEntry, list[tuple[str, str]]]:
        """The model to route to and the notes (kind, text) of each constraint that moved the choice."""
        notes: list[tuple[str, str]] = []
        candidates = self.models_by_tier
        if team is not None:
            candidates = {tier: [e for e in entries if team.may_use(e.name)] for tier, entries in candidates.items()}
        # 3. models the team may use
        if not candidates[self.tiers[index]]:
            allowed = [i for i in _nearest_first(index, len(self.tiers)) if candidates[self.tiers[i]]]
            if not allowed:
                assert team is not None
                raise ModelNotAllowed(
                    f"Team '{team.name}' may use none of the models that model='auto' routes to "
                    f"({', '.join(e.name for entries in self.models_by_tier.values() for e in entries)}).",
                    param="model",
                )
            notes.append(("team", f"({self.tiers[index]} not allowed)"))
            index = allowed[0]
        # 4. capabilities
        index, candidates = self._capable(index, candidates, needed, notes)
        # 5. context window
        num_tokens = estimated_tokens(request)
        fits = [any(_holds(e, num_tokens) for e in candidates[tier]) for tier in self.tiers]
        if not fits[index]:
            larger = [i for i in range(index + 1, len(self.tiers)) if fits[i]]
            if not larger:
                raise InvalidRequest(
                    f"No model for auto routing can hold about {num_tokens} tokens.",
                    param="messages",
                    code="context_length_exceeded",
                )
            notes.append(("context", f"(context>{self.tiers[index]})"))
            index = larger[0]

        def usable(i: int) -> ModelEntry | None:
            return self._usable(candidates[self.tiers[i]], num_tokens) if fits[i] else None

        # 6. health and saturation
        entry = usable(index)
        if entry is None:
            for other in _nearest_first(index, len(self.tiers)):
                entry = usable(other)
                if entry is not None:
                    notes.append(("health", f"({self.tiers[index]} busy or down)"))
                    index = other
                    break
            else:  # nothing is known to be healthy: try the chosen tier anyway; its own error explains
                entry = candidates[self.tiers[index]][0]
        # 7. budget headroom
        if headroom_usd is not None and estimated_cost_usd(request, self.prices.get(entry.name)) > headroom_usd:
            below = [e for i in range(index - 1, -1, -1) if (e := usable(i)) is not None]  # nearest first
            if below:
                fitting = [e for e in below if estimated_cost_usd(request, self.prices.get(e.name)) <= headroom_usd]
                notes.append(("budget", f"({self.tiers[index]} over budget)"))
                entry = fitting[0] if fitting else below[-1]  # else the lowest usable tier
        return entry, notes

    def _capable(
        self,
        index: int,
        candidates: dict[str, list[ModelEntry]],
        needed: dict[str, str],
        notes: list[tuple[str, str]],
    ) -> tuple[int, dict[str, list[ModelEntry]]]:
        """The tier to go to and the candidates that can serve a request needing `needed`."""
        if not needed:
            return index, candidates
        capable = {
            tier: [e for e in entries if not e.capabilities.lacks(needed)] for tier, entries in candidates.items()
        }
        if capable[self.tiers[index]]:
            return index, capable
        others = _nearest_above_first(index, len(self.tiers))
        able = [i for i in others if capable[self.tiers[i]]]
        # the chosen tier's first: its first lacking parameter is the 400's
        lacking = {e.name: e.capabilities.lacks(needed) for i in (index, *others) for e in candidates[self.tiers[i]]}
        if not able:
            raise unsupported_by_any("model='auto'", lacking)
        first = candidates[self.tiers[index]][0]
        notes.append(("capability", f"({self.tiers[index]} lacks {explain(lacking[first.name])})"))
        return able[0], capable

    @staticmethod
    def _usable(entries: list[ModelEntry], needed: int) -> ModelEntry | None:
        """The first of `entries` (all able to serve the request) that holds `needed` tokens, is
        ready and is not saturated."""
        for entry in entries:
            if not _holds(entry, needed):
                continue
            backend = entry.backend
            if backend.is_ready() and not backend.is_saturated():
                return entry
        return None


def _holds(entry: ModelEntry, num_tokens: int) -> bool:
    window = entry.capabilities.context_window
    return window is None or window >= num_tokens


def _nearest_above_first(index: int, count: int) -> list[int]:
    """The other tiers, the nearest above first (escalating before degrading), then those below."""
    return [*range(index + 1, count), *range(index - 1, -1, -1)]


def _nearest_first(index: int, count: int) -> list[int]:
    """The other tiers, the nearest below first (degrading before escalating), then those above."""
    return [*range(index - 1, -1, -1), *range(index + 1, count)]


CASCADE_MODEL = "cascade"


def cascade_not_configured() -> ModelNotFound:
    return ModelNotFound(
        "model='cascade' needs cascade.ladder in the configuration (see the README, Cascade).", param="model"
    )


def auto_not_configured() -> ModelNotFound:
    return ModelNotFound(
        "model='auto' needs routing.auto.tiers in the configuration (see the README, Routing).", param="model"
    )


def resolve_value_rule(
    tiers: list[str],
    quality_models: dict[str, str] | None,
    tolerance: Mapping[str, float] | None,
    thresholds_file: ThresholdsFile | None,
) -> ValueRule | None:
    """Routing by value: each tier's model (the config's, else the thresholds file's) and each
    mode's tolerance (the config's, else the file's, else the defaults). None: route by thresholds."""
    routing = thresholds_file.routing if thresholds_file is not None else None
    from_file = routing.by_value if routing is not None else None
    if quality_models is None and from_file is not None and from_file.quality_models:
        quality_models = from_file.quality_models
        if set(quality_models) != set(tiers):
            raise ValueError(
                f"the thresholds file's routing.by_value names tiers {', '.join(quality_models)}; "
                f"routing.auto.tiers are {', '.join(tiers)}"
            )
    if quality_models is None:
        return None
    picked = from_file.tolerances() if from_file is not None else {}
    tolerances = {**DEFAULT_TOLERANCES, **picked, **(tolerance or {})}
    return ValueRule(tuple(quality_models[tier] for tier in tiers), tolerances)


def resolve_thresholds(
    tiers: list[str], configured: list[float] | None, thresholds_file: ThresholdsFile | None
) -> dict[str, list[float]]:
    """Quality mode -> ascending thresholds: from the thresholds file, else the config, else even steps."""
    expected = len(tiers) - 1
    modes: dict[str, list[float]] = {}
    routing = thresholds_file.routing if thresholds_file is not None else None
    if routing is not None and routing.router is None and not routing.values():
        routing = None  # a file with only `routing.by_value`
    if routing is not None:
        if routing.router != "classifier":
            raise ValueError(
                f"the thresholds file is for router {routing.router!r}; the proxy routes with 'classifier'"
            )
        modes["balanced"] = routing.values()
        for mode, section in routing.modes.items():
            modes[mode] = section.values()
    elif configured is not None:
        modes["balanced"] = list(configured)
    else:
        modes["balanced"] = [(i + 1) / len(tiers) for i in range(expected)]
    for mode, values in modes.items():
        if len(values) != expected or values != sorted(values):
            raise ValueError(
                f"quality mode {mode!r} has thresholds {values}; {len(tiers)} tiers need {expected}, ascending"
            )
    return modes
