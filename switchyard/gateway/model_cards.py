"""What `/v1/models` and `/v1/models/{id}` show: a card per model the caller may use, then `auto`
and `cascade` when they are configured and lead somewhere the caller may go.

A model's card shows its kind (chat or embedding), its base model when it is a LoRA adapter
(`parent`), its tier, context window, readiness and capabilities (the backend's report
under the config's `capabilities:`). The cards of `auto` and `cascade` show what at least one of
the models they may pick can do (both pass over a model that cannot serve a request for one that
can), and which models those are: `auto`'s `tiers`, the cascade's `ladder`, and the routing
versions that route them (`routing_versions`, role -> version; `rollout_share` during a rollout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from switchyard.backends.registry import ModelEntry
from switchyard.billing.teams import Team
from switchyard.core.capabilities import CAPABILITY_NAMES
from switchyard.core.chat_wire import ModelCard
from switchyard.core.errors import ModelNotFound
from switchyard.gateway.auto_router import CASCADE_MODEL


def model_cards(services, team: Team | None) -> list[ModelCard]:
    """Every card the caller may see, the configured models first, in the config's order."""
    cards = [_card(entry) for entry in services.registry if entry.open_to(team)]
    return cards + [card for name in _route_names(services) if (card := _route_card(services, name, team))]


def model_card(services, team: Team | None, model: str) -> ModelCard:
    """The card of one model; ModelNotFound (404) for one that does not exist or the caller may not use."""
    card = next((c for c in model_cards(services, team) if c.id == model), None)
    if card is None:
        raise ModelNotFound(f"The model '{model}' does not exist or you do not have access to it.", param="model")
    return card


def _card(entry: ModelEntry) -> ModelCard:
    capabilities = entry.capabilities  # the context window: the config's, else the backend's
    return ModelCard(
        id=entry.name,
        kind=entry.kind,
        parent=entry.parent,
        tier=entry.tier,
        context_window=capabilities.context_window,
        ready=entry.backend.is_ready(),
        capabilities=capabilities.as_dict(),
    )


def _route_names(services) -> list[str]:
    return [name for name, route in (("auto", services.auto_router), (CASCADE_MODEL, services.cascade)) if route]


def _route_card(services, name: str, team: Team | None) -> ModelCard | None:
    tiers = ladder = None
    routings = services.routings
    if name == CASCADE_MODEL:
        first = services.cascade.rungs[0].entry  # the cascade refuses a team that may not use it
        entries = [rung.entry for rung in services.cascade.rungs] if team is None or team.may_use(first.name) else []
        ladder = [entry.name for entry in entries]
    else:
        by_tier = {
            tier: [entry for entry in entries if team is None or team.may_use(entry.name)]
            for tier, entries in services.auto_router.models_by_tier.items()
        }
        tiers = {tier: [entry.name for entry in entries] for tier, entries in by_tier.items()}
        entries = [entry for entries in by_tier.values() for entry in entries]
    if not entries:
        return None
    capabilities = _any_of(entries)
    return ModelCard(
        id=name,
        context_window=capabilities["context_window"],
        ready=any(entry.backend.is_ready() for entry in entries),
        capabilities=capabilities,
        tiers=tiers,
        ladder=ladder,
        routing_versions={routing.role: routing.version for routing in routings},
        rollout_share=routings.share if routings.candidate is not None else None,
    )


def _any_of(entries: Sequence[ModelEntry]) -> dict[str, Any]:
    """Each capability at least one entry has; the largest context window (None if one is unknown)."""
    each = [entry.capabilities for entry in entries]
    combined: dict[str, Any] = {name: any(getattr(c, name) for c in each) for name in CAPABILITY_NAMES}
    windows = [c.context_window for c in each if c.context_window is not None]
    combined["context_window"] = max(windows) if len(windows) == len(each) else None
    return combined
