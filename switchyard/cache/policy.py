"""What the response cache may do with one request: its mode (team, route, config), whether the
request may be answered from the cache at all, and the scope its entries live in.

A request the cache could serve gets a verdict: `exact` or `semantic` (looked up, and its answer
kept), or `bypass` (the client said no, or the answer cannot be replayed: n > 1, or the request is
not deterministic and its route does not opt in). `off`: the cache has nothing to do with it (its
mode is off, or it is not a chat request), and no header says anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from switchyard.cache.guard import DEFAULT_SIMILARITY_BY_EMBEDDER
from switchyard.core.cache_settings import CacheRouteSettings, CacheSettings
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.settings import Settings

Verdict = Literal["off", "bypass", "exact", "semantic"]
SHARED_SCOPE = "*shared*"  # `cache.scope: shared` (not a team name: those have no asterisks)
NO_TEAM_SCOPE = "*anyone*"  # no teams configured: every caller is one


def client_refuses(cache_header: str | None, cache_control: str | None) -> bool:
    """`x-switchyard-cache: off`, or `Cache-Control: no-cache` (or `no-store`)."""
    if cache_header is not None and cache_header.strip().lower() == "off":
        return True
    if cache_control is None:
        return False
    directives = {part.strip().split("=", 1)[0].lower() for part in cache_control.split(",")}
    return bool(directives & {"no-cache", "no-store"})


@dataclass(frozen=True, slots=True)
class CachePolicy:
    settings: CacheSettings
    team_modes: Mapping[str, str] = field(default_factory=dict)  # teams.<name>.cache, where set

    @classmethod
    def of(cls, settings: Settings) -> CachePolicy:
        modes = {name: team.cache for name, team in settings.teams.items() if team.cache is not None}
        return cls(settings.cache, modes)

    @property
    def is_on(self) -> bool:
        """Any request at all may be cached (the store is worth building)."""
        on = {self.settings.mode, *self.team_modes.values(), *(r.mode for r in self.settings.routes.values())}
        return bool(on & {"exact", "semantic"})

    @property
    def is_semantic_anywhere(self) -> bool:
        """Some team or route looks answers up by meaning (the embedder is worth warming)."""
        modes = {self.settings.mode, *self.team_modes.values(), *(r.mode for r in self.settings.routes.values())}
        return "semantic" in modes

    @property
    def similarity(self) -> float:
        """`cache.similarity`, else the threshold `switchyard eval cache` picked for the embedder."""
        if self.settings.similarity is not None:
            return self.settings.similarity
        return DEFAULT_SIMILARITY_BY_EMBEDDER[self.settings.embedder]

    def _route(self, route: str) -> CacheRouteSettings | None:
        return self.settings.routes.get(route)

    def mode_for(self, team: str | None, route: str) -> str:
        """The team's own mode, else the route's, else `cache.mode`."""
        if team is not None and team in self.team_modes:
            return self.team_modes[team]
        routed = self._route(route)
        if routed is not None and routed.mode is not None:
            return routed.mode
        return self.settings.mode

    def verdict(self, request: object, route: str, team: str | None, *, client_refuses: bool) -> Verdict:
        """`route` is what the client asked for (a model's name, auto or cascade)."""
        if not isinstance(request, ChatCompletionRequest):
            return "off"
        mode = self.mode_for(team, route)
        if mode == "off":
            return "off"
        if client_refuses or (request.n or 1) > 1:
            return "bypass"
        routed = self._route(route)
        is_deterministic = request.temperature == 0 or request.seed is not None
        if not is_deterministic and not (routed is not None and routed.nondeterministic):
            return "bypass"
        return "semantic" if mode == "semantic" else "exact"

    def scope_of(self, team: str | None) -> str:
        if self.settings.scope == "shared":
            return SHARED_SCOPE
        return team if team is not None else NO_TEAM_SCOPE

    def hit_cost_usd(self, saved_tokens: int) -> float:
        return self.settings.hit_price_usd_per_mtok * saved_tokens / 1e6
