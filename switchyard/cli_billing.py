"""`switchyard teams …` and `switchyard keys …`: teams and API keys in the database.

They open the database the config names (`billing.database_url`, else the SQLite ledger file),
so they work on a stopped proxy or beside a running one (which picks changes up on its own).
Teams from the YAML file are listed too but are changed only there; a key may name a YAML or a
database team. `keys create` prints the new key as the last line of stdout: it is shown once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from switchyard.backends.defaults import load_settings
from switchyard.billing import admin
from switchyard.billing.store import Database, StoreError, open_database
from switchyard.billing.teams import LIMITS, ApiKey, Team, yaml_keys
from switchyard.core.errors import SwitchyardError
from switchyard.core.settings import DEFAULT_CONFIG_NAME, ConfigError, Settings
from switchyard.evals.cli_support import cli_error

T = TypeVar("T")
teams_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Teams: budgets, limits, models, priority.")
keys_app = typer.Typer(no_args_is_help=True, add_completion=False, help="API keys: create, list, revoke.")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"YAML config file (its billing.database_url). Default: ./{DEFAULT_CONFIG_NAME} if present.",
        dir_okay=False,
    ),
]
DayBudget = Annotated[
    float | None, typer.Option("--budget-usd-per-day", min=0, max=LIMITS.max_usd, help="USD per UTC day.")
]
MonthBudget = Annotated[
    float | None, typer.Option("--budget-usd-per-month", min=0, max=LIMITS.max_usd, help="USD per UTC month.")
]
Rpm = Annotated[int | None, typer.Option("--rpm", min=1, max=LIMITS.max_per_minute, help="Requests per minute.")]
Tpm = Annotated[
    int | None,
    typer.Option("--tpm", min=1, max=LIMITS.max_per_minute, help="Tokens (prompt + max_tokens) per minute."),
]
Models = Annotated[str | None, typer.Option("--models", help="Models it may use, comma-separated (default: all).")]
Priority = Annotated[
    str | None, typer.Option("--priority", help="interactive, batch or a billing.priority_tiers name.")
]
TeamName = Annotated[str, typer.Option("--name", help="The team's name.")]


def _settings(config: Path | None) -> Settings:
    if config is None and Path(DEFAULT_CONFIG_NAME).is_file():
        config = Path(DEFAULT_CONFIG_NAME)
    try:
        return load_settings(config)
    except ConfigError as exc:
        raise cli_error(str(exc)) from exc


def _with_database(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> T:
    url = settings.billing.resolved_database_url()
    if url is None:
        raise cli_error("no database: set billing.database_url (or billing.ledger_path) in the config")

    async def run() -> T:
        database = await open_database(url)
        try:
            return await work(database)
        finally:
            await database.aclose()

    try:
        return asyncio.run(run())
    except SwitchyardError as exc:  # the admin checks: a YAML team, an unknown model or team, …
        raise cli_error(exc.message) from exc
    except (StoreError, ValueError) as exc:
        raise cli_error(str(exc)) from exc


def _team_changes(
    settings: Settings,
    day: float | None,
    month: float | None,
    rpm: int | None,
    tpm: int | None,
    models: str | None,
    priority: str | None,
) -> dict[str, Any]:
    changes: dict[str, Any] = {
        "budget_usd_per_day": day,
        "budget_usd_per_month": month,
        "rpm": rpm,
        "tpm": tpm,
        "priority": priority,
    }
    if models is not None:
        changes["models"] = frozenset(name.strip() for name in models.split(",") if name.strip())
    return {name: value for name, value in changes.items() if value is not None}


@teams_app.command("create")
def teams_create(
    name: TeamName,
    config: ConfigOption = None,
    budget_usd_per_day: DayBudget = None,
    budget_usd_per_month: MonthBudget = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    models: Models = None,
    priority: Priority = None,
) -> None:
    """Create a team in the database."""
    settings = _settings(config)
    team = Team(name, **_team_changes(settings, budget_usd_per_day, budget_usd_per_month, rpm, tpm, models, priority))
    _with_database(settings, lambda db: admin.create_team(db, settings, team))
    typer.echo(f"created team {name}")


@teams_app.command("update")
def teams_update(
    name: TeamName,
    config: ConfigOption = None,
    budget_usd_per_day: DayBudget = None,
    budget_usd_per_month: MonthBudget = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    models: Models = None,
    priority: Priority = None,
) -> None:
    """Change a database team: only the options given."""
    settings = _settings(config)
    changes = _team_changes(settings, budget_usd_per_day, budget_usd_per_month, rpm, tpm, models, priority)
    team = _with_database(settings, lambda db: admin.update_team(db, settings, name, changes))
    typer.echo(_team_line(team))


@teams_app.command("list")
def teams_list(config: ConfigOption = None) -> None:
    """Every team: the config file's (yaml) and the database's."""
    settings = _settings(config)
    for team in _with_database(settings, lambda db: admin.list_teams(db, settings)):
        typer.echo(_team_line(team))


def _team_line(team: Team) -> str:
    models = ",".join(sorted(team.models)) if team.models is not None else "all"
    return (
        f"{team.name}  source={team.source}  models={models}  usd/day={_or_dash(team.budget_usd_per_day)}  "
        f"usd/month={_or_dash(team.budget_usd_per_month)}  rpm={_or_dash(team.rpm)}  tpm={_or_dash(team.tpm)}  "
        f"priority={team.priority}"
    )


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


@keys_app.command("create")
def keys_create(
    team: Annotated[str, typer.Option("--team", help="The team the key belongs to (yaml or database).")],
    config: ConfigOption = None,
    budget_usd_per_day: DayBudget = None,
    budget_usd_per_month: MonthBudget = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    expires_in: Annotated[
        float | None, typer.Option("--expires-in", min=0, max=36_500, help="Days until it expires.")
    ] = None,
) -> None:
    """Create a key; prints its id, prefix, team and expiry (if any), then the key itself, last (shown once)."""
    settings = _settings(config)

    async def create(db: Database) -> tuple[str, ApiKey]:
        return await admin.create_key(
            db,
            settings,
            team,
            budget_usd_per_day=budget_usd_per_day,
            budget_usd_per_month=budget_usd_per_month,
            rpm=rpm,
            tpm=tpm,
            expires_in_days=expires_in,
        )

    key, api_key = _with_database(settings, create)
    typer.echo(f"id: {api_key.id}")
    typer.echo(f"prefix: {api_key.prefix}")
    typer.echo(f"team: {api_key.team}")
    if api_key.expires_at is not None:
        typer.echo(f"expires: {_when(api_key.expires_at)}")
    typer.echo(key)


@keys_app.command("list")
def keys_list(
    config: ConfigOption = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's keys.")] = None,
) -> None:
    """Keys (never the keys themselves): the config file's and the database's."""
    settings = _settings(config)
    listed = [
        (key, "yaml")
        for name, t in settings.teams.items()
        if team in (None, name)
        for key in yaml_keys(name, (k.get_secret_value() for k in t.api_keys))
    ]
    listed += [(key, "database") for key in _with_database(settings, lambda db: db.list_keys(team))]
    now = time.time()
    for key, source in listed:
        state = "revoked" if key.revoked_at is not None else "expired" if not key.is_usable(now) else "active"
        typer.echo(
            f"{key.id}  team={key.team}  prefix={key.prefix}  source={source}  {state}  "
            f"created={_when(key.created_at)}  expires={_when(key.expires_at)}  "
            f"usd/day={_or_dash(key.budget_usd_per_day)}  usd/month={_or_dash(key.budget_usd_per_month)}  "
            f"rpm={_or_dash(key.rpm)}  tpm={_or_dash(key.tpm)}"
        )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (key_…), as `keys list` shows it.")],
    config: ConfigOption = None,
) -> None:
    """Revoke a database key: a running proxy refuses it within a second."""
    settings = _settings(config)
    for name, t in settings.teams.items():
        if any(k.id == key_id for k in yaml_keys(name, (s.get_secret_value() for s in t.api_keys))):
            raise cli_error(f"key {key_id} is in the config file (team {name!r}): remove it there")
    key = _with_database(settings, lambda db: admin.revoke_key(db, key_id))
    typer.echo(f"revoked {key.id} (team {key.team}) at {_when(key.revoked_at)}")


def _when(at: float | None) -> str:
    return "-" if at is None else dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
