"""`switchyard report`: the analysts' report (CSV files, summary.json, report.html) from the ledger."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from switchyard.backends.defaults import load_settings
from switchyard.billing.teams import yaml_keys
from switchyard.core.errors import SwitchyardError
from switchyard.core.model_settings import hosting_overrides
from switchyard.core.prices import Price
from switchyard.core.settings import ConfigError, Settings
from switchyard.evals.cli_support import cli_error


def _day_start(day: dt.date | None, *, inclusive_end: bool = False) -> float | None:
    if day is None:
        return None
    start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()
    return start + 86_400 if inclusive_end else start


def _parse_day(value: str | None, option: str) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise cli_error(f"{option} must be a date like 2026-11-23, not {value!r}") from None


def report(
    out: Annotated[Path, typer.Option("--out", help="Folder for the CSV files, summary.json and report.html.")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.", dir_okay=False)] = None,
    since: Annotated[str | None, typer.Option(help="First day (UTC, YYYY-MM-DD). Default: the first record.")] = None,
    until: Annotated[
        str | None, typer.Option(help="Last day, inclusive (UTC, YYYY-MM-DD). Default: the last record.")
    ] = None,
    team: Annotated[
        str | None,
        typer.Option(
            help="One team only: a team of the config or the database, or one the ledger has usage of. "
            "Default: every team."
        ),
    ] = None,
) -> None:
    """Write the cost and escalation report for analysts, read from the usage ledger."""
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        raise cli_error(str(exc)) from exc
    url = settings.billing.resolved_database_url()
    if url is None:
        raise cli_error("no ledger to read: set billing.database_url (or billing.ledger_path)")
    first, last = _parse_day(since, "--since"), _parse_day(until, "--until")
    if first is not None and last is not None and last < first:
        raise cli_error(f"--until {last} is before --since {first}")
    prices = {m.name: m.price.to_price() for m in settings.models if m.price is not None}
    prefixes = {
        key.id: key.prefix
        for name, t in settings.teams.items()
        for key in yaml_keys(name, [k.get_secret_value() for k in t.api_keys])
    }
    written = asyncio.run(_write(url, out, settings, prices, prefixes, first, last, team))
    for path in written:
        typer.echo(path)


def _drift_references(settings: Settings):
    """The loaded version's drift references, from the config's thresholds file (None: it has none)."""
    from switchyard.billing.report import DriftReferences
    from switchyard.core.thresholds import ThresholdsError, read_thresholds

    path = settings.routing.thresholds_file
    try:
        thresholds = read_thresholds(path) if path is not None else None
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    return DriftReferences.of(thresholds, psi_alert=settings.drift.psi_alert, min_samples=settings.drift.min_samples)


async def _write(
    url: str,
    out: Path,
    settings: Settings,
    prices: dict[str, Price],
    prefixes: dict[str, str],
    first: dt.date | None,
    last: dt.date | None,
    team: str | None,
) -> list[Path]:
    from switchyard.billing.admin import check_known_team
    from switchyard.billing.report import build_report, previous_period
    from switchyard.billing.store import open_database
    from switchyard.billing.store.errors import StoreError
    from switchyard.learning.rows import judged_answers

    try:
        database = await open_database(url)
    except StoreError as exc:
        raise cli_error(f"cannot open the ledger: {exc}") from exc
    since, until = _day_start(first), _day_start(last, inclusive_end=True)
    before = previous_period(first, last)
    earlier = (_day_start(before[0]), _day_start(before[1], inclusive_end=True)) if before else None
    try:
        if team is not None:
            known = [*settings.teams, *(t.name for t in await database.list_teams())]
            await check_known_team(database, known, team)
        total = await database.count_usage(since, until, team)
        prefixes = prefixes | {key.id: key.prefix for key in await database.list_keys()}
        built = await build_report(
            database.iter_usage(since, until, team),
            prices=prices,
            since=first,
            until=last,
            team=team,
            total=total,
            progress=True,
            key_prefixes=prefixes,
            hosting=hosting_overrides(settings.models),
            previous_batches=database.iter_usage(*earlier, team) if earlier else None,
            previous_total=await database.count_usage(*earlier, team) if earlier else None,
            drift=_drift_references(settings),
            judged=await judged_answers(database, since=since, until=until),
        )
    except SwitchyardError as exc:  # an unknown team
        raise cli_error(exc.message) from exc
    finally:
        await database.aclose()
    return built.write(out)
