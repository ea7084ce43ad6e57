"""Teams: who is calling (an API key names a team), which models it may use, its daily budget.

With no teams configured the proxy is open: any key is accepted and every model may be used
(the embedded default). With teams, every `/v1` request needs `Authorization: Bearer <key>` of
one of them. Keys are kept as SHA-256 digests, never in memory as given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    models: frozenset[str] | None = None  # None: every configured model
    budget_usd_per_day: float | None = None  # None: no budget

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class UnknownKey(Exception):
    """No key, or one no team holds; the message says which (never the key)."""


class TeamDirectory:
    def __init__(self, teams: Iterable[tuple[Team, Iterable[str]]] = ()) -> None:
        self._by_key: dict[bytes, Team] = {}
        self.teams: dict[str, Team] = {}
        for team, keys in teams:
            self.teams[team.name] = team
            for key in keys:
                self._by_key[_digest(key)] = team

    @property
    def is_enabled(self) -> bool:
        return bool(self.teams)

    def authenticate(self, authorization: str | None) -> Team | None:
        """The team whose key the `Authorization` header carries; None when no teams are configured."""
        if not self.is_enabled:
            return None
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise UnknownKey("No API key: send 'Authorization: Bearer <key>' with a key of your team.")
        team = self._by_key.get(_digest(key.strip()))
        if team is None:
            raise UnknownKey("Incorrect API key: no team holds it.")
        return team
