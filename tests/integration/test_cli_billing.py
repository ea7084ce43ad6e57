"""`switchyard teams …` and `switchyard keys …` against a real database, SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from switchyard.billing.store import open_database
from switchyard.billing.teams import ApiKey, Team, digest, key_id_for
from switchyard.cli import app
from tests.servers.postgres import database_url, postgres_server, postgres_url  # noqa: F401

runner = CliRunner()
YAML_KEY = "sk-yaml-team-key"


@pytest.fixture
def config(tmp_path: Path, database_url: str) -> Path:  # noqa: F811
    path = tmp_path / "switchyard.yaml"
    models = [
        {"name": name, "backend": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "x"}
        for name in ("fake-small", "fake-large")
    ]
    text = {
        "billing": {"database_url": database_url, "priority_tiers": {"nightly": {"max_tokens": 64}}},
        "models": models,
        "teams": {"ops": {"api_keys": [YAML_KEY]}},
    }
    path.write_text(yaml.safe_dump(text))
    return path


def run(config: Path, *args: str, code: int = 0) -> list[str]:
    """Run `switchyard ARGS --config CONFIG`; check the exit code; return stdout's lines (or stderr's on error)."""
    result = runner.invoke(app, [*args, "--config", str(config)])
    assert result.exit_code == code, result.output
    return (result.stdout if code == 0 else result.stderr).splitlines()


def directory(config: Path) -> tuple[list[Team], list[ApiKey]]:
    """What the database holds, read beside the CLI as a running proxy would."""
    url = yaml.safe_load(config.read_text())["billing"]["database_url"]

    async def load() -> tuple[list[Team], list[ApiKey]]:
        database = await open_database(url)
        try:
            return await database.load_directory()
        finally:
            await database.aclose()

    return asyncio.run(load())


def test_teams_are_created_updated_and_listed_beside_the_yaml_ones(config: Path) -> None:
    run(config, "teams", "create", "--name", "search", "--budget-usd-per-day", "1.5", "--rpm", "60")
    run(config, "teams", "create", "--name", "ads", "--models", "fake-small,fake-large", "--priority", "nightly")
    [line] = run(config, "teams", "update", "--name", "search", "--tpm", "1000", "--models", "fake-small")
    assert "models=fake-small" in line and "rpm=60" in line and "tpm=1000" in line and "usd/day=1.5" in line
    assert [line.split()[:2] for line in run(config, "teams", "list")] == [
        ["ops", "source=yaml"],
        ["ads", "source=database"],
        ["search", "source=database"],
    ]
    teams, _ = directory(config)
    assert teams == [
        Team("ads", frozenset({"fake-small", "fake-large"}), priority="nightly", source="database"),
        Team("search", frozenset({"fake-small"}), 1.5, None, 60, 1000, source="database"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["teams", "create", "--name", "search"], "Team 'search' exists already; update it instead."),
        (["teams", "create", "--name", "ops"], "Team 'ops' is defined in the YAML file; edit the file to change it."),
        (["teams", "update", "--name", "ops", "--rpm", "5"], "Team 'ops' is defined in the YAML file"),
        (["teams", "update", "--name", "nobody", "--rpm", "5"], "No team 'nobody' in the database."),
        (["teams", "create", "--name", "x", "--models", "fake-small,gpt-9"], "may use gpt-9, which no configured"),
        (["teams", "create", "--name", "x", "--priority", "urgent"], "Priority 'urgent' is not one of interactive"),
        (["keys", "create", "--team", "nobody"], "No team 'nobody': create it first (switchyard teams create)."),
        (["keys", "revoke", "key_nope"], "No key 'key_nope'."),
        (["keys", "revoke", key_id_for(digest(YAML_KEY))], "is in the config file (team 'ops'): remove it there"),
    ],
)
def test_mistakes_get_a_clear_error(config: Path, args: list[str], message: str) -> None:
    run(config, "teams", "create", "--name", "search")
    [line] = run(config, *args, code=2)
    assert line.startswith("switchyard: ") and message in line


def test_a_key_is_shown_once_as_the_last_line_stored_as_its_digest_and_revoked(config: Path) -> None:
    run(config, "teams", "create", "--name", "search")
    lines = run(config, "keys", "create", "--team", "search", "--rpm", "10", "--expires-in", "30")
    key = lines[-1]
    assert key.startswith("sk-") and lines[0].startswith("id: key_")
    key_id = lines[0].removeprefix("id: ")
    yaml_team_key = run(config, "keys", "create", "--team", "ops", "--budget-usd-per-day", "0.5")[-1]
    _, keys = directory(config)
    assert [(k.id, k.team, k.rpm, k.digest) for k in keys[:1]] == [(key_id, "search", 10, digest(key))]
    assert (keys[1].team, keys[1].budget_usd_per_day, keys[1].digest) == ("ops", 0.5, digest(yaml_team_key))
    assert keys[0].expires_at is not None and keys[1].expires_at is None
    listed = run(config, "keys", "list", "--team", "search")
    assert len(listed) == 1 and listed[0].startswith(key_id) and " active " in listed[0]
    assert key not in "\n".join(run(config, "keys", "list"))
    [revoked] = run(config, "keys", "revoke", key_id)
    assert revoked.startswith(f"revoked {key_id} (team search)")
    assert " revoked " in run(config, "keys", "list", "--team", "search")[0]
    assert directory(config)[1][0].revoked_at is not None
    everything = run(config, "keys", "list")
    assert [line.split()[0] for line in everything] == [key_id_for(digest(YAML_KEY)), key_id, keys[1].id]
