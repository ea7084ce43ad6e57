"""`switchyard report` against a real ledger, SQLite and PostgreSQL alike: the team it may name, the
inclusive last day, the previous period; and the CLI's output as the docs show it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from switchyard.billing.records import UsageRecord
from switchyard.billing.store import open_database
from switchyard.billing.teams import Team
from switchyard.cli import app
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401

runner = CliRunner()
DOCS = Path(__file__).parents[2] / "docs"
NOV_20 = dt.datetime(2026, 11, 20, tzinfo=dt.UTC).timestamp()
DAY_S = 86_400


def attempt(request_id: str, started_at: float, team: str | None = "search", cost_usd: float = 0.1) -> UsageRecord:
    return UsageRecord(
        request_id=request_id,
        attempt=1,
        model="small",
        backend="openai#0",
        status="completed",
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=cost_usd,
        is_estimated=False,
        started_at=started_at,
        duration_ms=12.5,
        team=team,
        requested_model="small",
    )


LEDGER = [
    attempt("before-since", NOV_20 - 1),  # 19 November, 23:59:59: the previous period's
    attempt("first-day", NOV_20),
    attempt("last-second", NOV_20 + 2 * DAY_S - 1, cost_usd=0.2),  # 21 November, 23:59:59: in
    attempt("after-until", NOV_20 + 2 * DAY_S),  # 22 November, 00:00: out
    attempt("gone-team", NOV_20 + 60, team="gone", cost_usd=0.05),  # a team no longer in the config
]


@pytest.fixture
def config(tmp_path: Path, database_url: str) -> Path:  # noqa: F811
    async def write() -> None:
        database = await open_database(database_url)
        try:
            await database.insert_usage(LEDGER)
            await database.create_team(Team("research"))
        finally:
            await database.aclose()

    asyncio.run(write())
    path = tmp_path / "switchyard.yaml"
    models = [{"name": "small", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}]
    text = {"billing": {"database_url": database_url}, "models": models, "teams": {"search": {"api_keys": ["sk-s"]}}}
    path.write_text(yaml.safe_dump(text))
    return path


def report(config: Path, out: Path, *args: str):
    return runner.invoke(app, ["report", "--config", str(config), "--out", str(out), *args])


def test_an_unknown_team_is_an_error_naming_the_known_ones(config: Path, tmp_path: Path) -> None:
    result = report(config, tmp_path / "out", "--team", "serach")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "switchyard: No team 'serach' in the teams or in the ledger; known teams: gone, research, search."
    )
    assert not (tmp_path / "out").exists()


def test_a_team_only_the_ledger_knows_is_reported(config: Path, tmp_path: Path) -> None:
    result = report(config, tmp_path / "gone", "--team", "gone")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "gone" / "summary.json").read_text())
    assert (summary["team"], summary["requests"], summary["cost_usd"]) == ("gone", 1, 0.05)


def test_until_takes_in_its_whole_day_and_the_previous_period_is_read(config: Path, tmp_path: Path) -> None:
    result = report(config, tmp_path / "out", "--since", "2026-11-20", "--until", "2026-11-21", "--team", "search")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["first_day"], summary["last_day"], summary["requests"]) == ("2026-11-20", "2026-11-21", 2)
    assert summary["cost_usd"] == 0.3  # first-day and last-second: not after-until, not before-since
    assert (summary["previous"]["since"], summary["previous"]["until"]) == ("2026-11-18", "2026-11-19")
    assert (summary["previous"]["requests"], summary["previous"]["cost_usd"]) == (1, 0.1)
    assert summary["change"]["cost_usd"] == {"absolute": 0.2, "pct": pytest.approx(200.0)}
    open_ended = report(config, tmp_path / "open", "--since", "2026-11-20")
    assert open_ended.exit_code == 0, open_ended.output
    summary = json.loads((tmp_path / "open" / "summary.json").read_text())
    assert (summary["previous"], summary["change"]) == (None, None)


def test_the_help_and_the_docs_say_the_last_day_is_inclusive() -> None:
    command = typer.main.get_command(app).commands["report"]  # type: ignore[attr-defined]
    until = next(p for p in command.params if p.name == "until")
    assert until.help.startswith("Last day, inclusive")
    row = next(line for line in (DOCS / "reports.md").read_text().splitlines() if "`--until D`" in line)
    assert "both inclusive" in row


def test_keys_create_prints_what_the_docs_show(config: Path) -> None:
    result = runner.invoke(app, ["keys", "create", "--config", str(config), "--team", "research", "--expires-in", "90"])
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    text = (DOCS / "teams-and-metering.md").read_text()
    example = text.split("switchyard keys create ", 1)[1].split("switchyard keys list", 1)[0]
    shown = [line.removeprefix("# ") for line in example.splitlines() if line.startswith("# ")]
    assert len(shown) == len(printed) == 5
    for doc_line, line in zip(shown[:-1], printed[:-1], strict=True):
        label = doc_line.split(":", 1)[0]
        assert line.startswith(f"{label}: "), (doc_line, line)
    assert re.match(r"^id: key_[0-9a-f]{16}$", printed[0])
    assert printed[2] == "team: research"
    assert shown[-1].startswith("sk-sy-") and printed[-1].startswith("sk-sy-")  # the key itself, last
