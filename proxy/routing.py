"""`model="auto"`: score the prompt, pick a tier by threshold, then apply constraints in order.

Order of application (each step may move the request to another tier):

1. score: the classifier scores the system prompt plus the last user turn; late or failed, the
   configured default tier is used and the route says why;
2. thresholds: tiers ascend (e.g. small < t1 <= large < t2 <= commercial); the quality mode
   (`x-switchyard-quality: economy | balanced | max`) picks the threshold set;
3. models the team may use: (arrives with team API keys; today every configured model is allowed);
4. context window: a tier whose model cannot hold the prompt plus `max_tokens` is skipped upward;
5. health and saturation: a tier whose backend is not ready, or is saturated, gives way to the
   nearest tier below it that is ready, else the nearest above (degrading before escalating);
6. budget headroom: (arrives with billing).

The decision is explained in `x-switchyard-route` (ASCII, as headers must be), e.g.
`auto:classifier=0.31<0.45->small`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from classifier.runtime import MicroBatcher, ScoreUnavailable
from proxy.errors import InvalidRequest, ModelNotFound
from proxy.protocol import ChatCompletionRequest, CompletionRequest, message_text
from proxy.registry import ModelEntry, ModelRegistry

QUALITY_MODES = ("economy", "balanced", "max")


@dataclass(frozen=True, slots=True)
class RouteDecision:
    entry: ModelEntry
    reason: str
    score: float | None
    margin: float | None = None  # distance from the score to the nearest threshold


def routing_text(request: ChatCompletionRequest | CompletionRequest) -> str:
    """What the classifier reads: the system prompt(s) and the last user turn."""
    if isinstance(request, CompletionRequest):
        prompt = request.prompt
        return prompt if isinstance(prompt, str) else (prompt[0] if prompt and isinstance(prompt[0], str) else "")
    parts = [message_text(m.content) for m in request.messages if m.role in ("system", "developer")]
    users = [m for m in request.messages if m.role == "user"]
    if users:
        parts.append(message_text(users[-1].content))
    return "\n".join(p for p in parts if p)


def estimated_prompt_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens at four characters a token."""
    if isinstance(request, ChatCompletionRequest):
        chars = sum(len(message_text(m.content)) for m in request.messages)
    else:
        chars = len(routing_text(request))
    return math.ceil(chars / 4)


def estimated_tokens(request: ChatCompletionRequest | CompletionRequest) -> int:
    """Prompt tokens at four characters a token, plus the answer budget asked for."""
    if isinstance(request, ChatCompletionRequest):
        answer = request.max_completion_tokens or request.max_tokens or 0
    else:
        answer = request.max_tokens or 0
    return estimated_prompt_tokens(request) + answer


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
    ) -> None:
        self.registry = registry
        self.tiers = tiers
        self.thresholds = thresholds  # quality mode -> ascending thresholds, len(tiers) - 1 each
        self.scorer = scorer
        self.router_name = router_name
        self.default_tier = default_tier
        self.deadline_s = deadline_ms / 1000
        self.models_by_tier = {tier: [e for e in registry if e.tier == tier] for tier in tiers}
        missing = [tier for tier, entries in self.models_by_tier.items() if not entries]
        if missing:
            raise ValueError(f"routing.auto.tiers names tier(s) no model has: {', '.join(missing)}")

    async def route(self, request: ChatCompletionRequest | CompletionRequest, quality: str | None) -> RouteDecision:
        mode = quality or "balanced"
        if mode not in QUALITY_MODES:
            raise InvalidRequest(
                f"x-switchyard-quality must be one of {', '.join(QUALITY_MODES)}, not {quality!r}.",
                param="x-switchyard-quality",
            )
        thresholds = self.thresholds.get(mode) or self.thresholds["balanced"]
        score: float | None = None
        if self.scorer is None:
            index, reason = self.tiers.index(self.default_tier), f"auto:no-{self.router_name}"
        else:
            try:
                score = await self.scorer.score(routing_text(request), self.deadline_s)
            except ScoreUnavailable as exc:
                index, reason = self.tiers.index(self.default_tier), f"auto:{exc.reason}"
            else:
                index = sum(score >= t for t in thresholds)
                reason = f"auto:{self.router_name}={score:.3f}" + (
                    f"<{thresholds[index]:.3f}" if index < len(thresholds) else f">={thresholds[-1]:.3f}"
                )
                if mode != "balanced":
                    reason += f"({mode})"
        entry, notes = self._constrain(index, request)
        margin = min(abs(score - t) for t in thresholds) if score is not None and thresholds else None
        return RouteDecision(entry, reason + "->" + entry.tier + "".join(notes), score, margin)

    def _constrain(self, index: int, request) -> tuple[ModelEntry, list[str]]:
        notes: list[str] = []
        needed = estimated_tokens(request)
        fits = [
            any(e.context_window is None or e.context_window >= needed for e in self.models_by_tier[tier])
            for tier in self.tiers
        ]
        if not fits[index]:
            larger = [i for i in range(index + 1, len(self.tiers)) if fits[i]]
            if not larger:
                raise InvalidRequest(
                    f"No model for auto routing can hold about {needed} tokens.",
                    param="messages",
                    code="context_length_exceeded",
                )
            notes.append(f"(context>{self.tiers[index]})")
            index = larger[0]
        entry = self._usable(self.tiers[index], needed)
        if entry is not None:
            return entry, notes
        below = [i for i in range(index - 1, -1, -1) if fits[i]]
        above = [i for i in range(index + 1, len(self.tiers)) if fits[i]]
        for other in below + above:
            entry = self._usable(self.tiers[other], needed)
            if entry is not None:
                notes.append(f"({self.tiers[index]} busy or down)")
                return entry, notes
        # Nothing is known to be healthy: try the chosen tier anyway; its own error explains.
        return self.models_by_tier[self.tiers[index]][0], notes

    def _usable(self, tier: str, needed: int) -> ModelEntry | None:
        for entry in self.models_by_tier[tier]:
            if entry.context_window is not None and entry.context_window < needed:
                continue
            backend = entry.backend
            if backend.is_ready() and not getattr(backend, "is_saturated", lambda: False)():
                return entry
        return None


CASCADE_MODEL = "cascade"


def cascade_not_configured() -> ModelNotFound:
    return ModelNotFound(
        "model='cascade' needs cascade.ladder in the configuration (see the README, Cascade).", param="model"
    )


def auto_not_configured() -> ModelNotFound:
    return ModelNotFound(
        "model='auto' needs routing.auto.tiers in the configuration (see the README, Routing).", param="model"
    )


def resolve_thresholds(
    tiers: list[str], configured: list[float] | None, thresholds_file: dict | None
) -> dict[str, list[float]]:
    """Quality mode -> ascending thresholds: from the thresholds file, else the config, else even steps."""
    expected = len(tiers) - 1
    modes: dict[str, list[float]] = {}
    routing = (thresholds_file or {}).get("routing")
    if routing:
        if routing.get("router") != "classifier":
            raise ValueError(
                f"the thresholds file is for router {routing.get('router')!r}; the proxy routes with 'classifier'"
            )
        modes["balanced"] = list(routing.get("thresholds") or [routing["threshold"]])
        for mode, section in (routing.get("modes") or {}).items():
            modes[mode] = list(section.get("thresholds") or [section["threshold"]])
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
