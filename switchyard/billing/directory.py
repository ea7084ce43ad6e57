"""Who may call: the teams and keys of the YAML file and of the database, merged, kept current.

A running proxy re-reads the database's teams and keys when their version changes (it asks every
`refresh_s`, 0.25 s by default), so a key created or revoked by `switchyard keys` or the admin API
is honoured within a second by every replica. The database down: the last copy read stays in use
(logged), so requests keep being authenticated.

With no team anywhere the proxy is open; as soon as one exists (YAML or database), every request
needs a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from switchyard.billing.teams import ApiKey, Principal, Team, digest, same_digest

logger = logging.getLogger("switchyard.directory")


class DirectoryStore(Protocol):
    """What the directory needs of the database (`switchyard.billing.store`)."""

    async def directory_version(self) -> int: ...

    async def load_directory(self) -> tuple[list[Team], list[ApiKey]]: ...


class UnknownKey(Exception):
    """No key, or one that is unknown, revoked or expired; the message says which (never the key)."""


class Directory:
    def __init__(
        self,
        yaml_teams: Iterable[tuple[Team, list[ApiKey]]] = (),
        store: DirectoryStore | None = None,
        *,
        refresh_s: float = 0.25,
    ) -> None:
        self._yaml = [(team, list(keys)) for team, keys in yaml_teams]
        self.store = store
        self.refresh_s = refresh_s
        self.teams: dict[str, Team] = {}
        self._keys: dict[bytes, ApiKey] = {}
        self._keys_by_id: dict[str, ApiKey] = {}
        self._version: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._apply([], [])

    def _apply(self, db_teams: list[Team], db_keys: list[ApiKey]) -> None:
        teams = {team.name: team for team in db_teams}
        keys = list(db_keys)
        for team, team_keys in self._yaml:  # YAML teams stay as they are
            teams[team.name] = team
            keys += team_keys
        self.teams = teams
        self._keys = {key.digest: key for key in keys}
        self._keys_by_id = {key.id: key for key in keys}

    @property
    def is_enabled(self) -> bool:
        return bool(self.teams)

    def key(self, key_id: str) -> ApiKey | None:
        return self._keys_by_id.get(key_id)

    def keys(self) -> list[ApiKey]:
        return list(self._keys_by_id.values())

    async def start(self) -> None:
        if self.store is None:
            return
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_forever())

    async def refresh(self) -> bool:
        """Re-read the database's teams and keys if they changed; True if they did."""
        assert self.store is not None
        version = await self.store.directory_version()
        if version == self._version:
            return False
        teams, keys = await self.store.load_directory()
        self._apply(teams, keys)
        self._version = version
        return True

    async def _refresh_forever(self) -> None:
        failing_since: float | None = None
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # the database down: keep the last copy, say so now and then
                now = time.monotonic()
                if failing_since is None or now - failing_since > 30:
                    logger.warning("cannot re-read teams and keys (%s); using the copy read before", exc)
                    failing_since = now
            else:
                if failing_since is not None:
                    logger.info("teams and keys are read from the database again")
                failing_since = None

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def authenticate(self, authorization: str | None, now: float | None = None) -> Principal | None:
        """The caller of the `Authorization` header; None when no team exists anywhere."""
        if not self.is_enabled:
            return None
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise UnknownKey("No API key: send 'Authorization: Bearer <key>' with a key of your team.")
        return self.identify(given.strip(), now)

    def identify(self, secret: str, now: float | None = None) -> Principal:
        """The caller holding the key `secret` (raises UnknownKey); teams must exist (`is_enabled`)."""
        wanted = digest(secret)
        key = self._keys.get(wanted)
        if key is None or not same_digest(key.digest, wanted):
            raise UnknownKey("Incorrect API key: no team holds it.")
        if key.revoked_at is not None:
            raise UnknownKey(f"API key {key.id} ({key.prefix}) has been revoked.")
        if not key.is_usable(time.time() if now is None else now):
            raise UnknownKey(f"API key {key.id} ({key.prefix}) has expired.")
        team = self.teams.get(key.team)
        if team is None:
            raise UnknownKey(f"API key {key.id} ({key.prefix}) names team '{key.team}', which no longer exists.")
        return Principal(team, key)
