"""Managing teams and keys at run time: the checks and steps the admin API and the CLI share.

YAML teams stay as the file says: they are listed beside the database's, cannot be created again
or changed here, but may be given more keys. Errors are Switchyard's own (`Conflict`, `NotFound`,
`InvalidRequest`), so the admin API answers them as OpenAI-style errors and the CLI prints them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from switchyard.billing.store import Database
from switchyard.billing.store.errors import StoreConflict, StoreNotFound
from switchyard.billing.teams import PRIORITY_DEFAULT, ApiKey, Team
from switchyard.core.errors import Conflict, InvalidRequest, NotFound
from switchyard.core.settings import Settings

BUILT_IN_PRIORITIES = ("interactive", "batch")


def yaml_team(settings: Settings, name: str) -> Team | None:
    team = settings.teams.get(name)
    if team is None:
        return None
    models = frozenset(team.models) if team.models is not None else None
    return Team(name, models, team.budget_usd_per_day, team.budget_usd_per_month, team.rpm, team.tpm, team.priority)


def check_team(settings: Settings, team: Team) -> None:
    configured = {model.name for model in settings.models}
    unknown = sorted(set(team.models or ()) - configured)
    if unknown:
        raise InvalidRequest(
            f"Team '{team.name}' may use {', '.join(unknown)}, which no configured model is named "
            f"(configured: {', '.join(sorted(configured)) or 'none'}).",
            param="models",
        )
    priorities = (*BUILT_IN_PRIORITIES, *settings.billing.priority_tiers)
    if team.priority not in priorities:
        raise InvalidRequest(
            f"Priority '{team.priority}' is not one of {', '.join(priorities)} (billing.priority_tiers names more).",
            param="priority",
        )


async def list_teams(database: Database, settings: Settings) -> list[Team]:
    """The YAML teams, then the database's."""
    from_yaml = [yaml_team(settings, name) for name in settings.teams]
    return [team for team in from_yaml if team is not None] + await database.list_teams()


async def create_team(database: Database, settings: Settings, team: Team) -> Team:
    if team.name in settings.teams:
        raise Conflict(f"Team '{team.name}' is defined in the YAML file; edit the file to change it.", param="name")
    team = replace(team, source="database", priority=team.priority or PRIORITY_DEFAULT)
    check_team(settings, team)
    try:
        await database.create_team(team)
    except StoreConflict:
        raise Conflict(f"Team '{team.name}' exists already; update it instead.", param="name") from None
    return team


async def update_team(database: Database, settings: Settings, name: str, changes: dict[str, Any]) -> Team:
    if name in settings.teams:
        raise Conflict(f"Team '{name}' is defined in the YAML file; edit the file to change it.", param="name")
    teams = {team.name: team for team in await database.list_teams()}
    if name not in teams:
        raise NotFound(f"No team '{name}' in the database.", param="name")
    check_team(settings, replace(teams[name], **changes))
    try:
        return await database.update_team(name, **changes)
    except StoreNotFound:
        raise NotFound(f"No team '{name}' in the database.", param="name") from None


async def create_key(
    database: Database,
    settings: Settings,
    team: str,
    *,
    budget_usd_per_day: float | None = None,
    budget_usd_per_month: float | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    expires_in_days: float | None = None,
) -> tuple[str, ApiKey]:
    """A new key for a YAML or database team: (the key, shown once; its record)."""
    if team not in settings.teams and team not in {t.name for t in await database.list_teams()}:
        raise NotFound(f"No team '{team}': create it first (switchyard teams create).", param="team")
    expires_at = time.time() + expires_in_days * 86_400 if expires_in_days is not None else None
    return await database.create_key(
        team,
        budget_usd_per_day=budget_usd_per_day,
        budget_usd_per_month=budget_usd_per_month,
        rpm=rpm,
        tpm=tpm,
        expires_at=expires_at,
    )


MAX_NAMED_TEAMS = 20  # an unknown team's error names at most this many known ones


async def check_known_team(database: Database, directory_teams: Iterable[str], team: str) -> None:
    """Usage and reports are for a team the directory knows (YAML or database) or the ledger has
    usage of (a team removed since keeps its history); any other name is a typo: NotFound, naming
    the known teams."""
    known = set(directory_teams)
    if team in known:
        return
    in_ledger = await database.usage_teams()
    if team in in_ledger:
        return
    names = sorted(known | set(in_ledger))
    shown = ", ".join(names[:MAX_NAMED_TEAMS])
    if len(names) > MAX_NAMED_TEAMS:
        shown += f" and {len(names) - MAX_NAMED_TEAMS} more"
    raise NotFound(f"No team '{team}' in the teams or in the ledger; known teams: {shown or 'none'}.", param="team")


async def revoke_key(database: Database, key_id: str) -> ApiKey:
    try:
        return await database.revoke_key(key_id)
    except StoreNotFound:
        raise NotFound(f"No key '{key_id}'.", param="key_id") from None
