"""`switchyard serve`'s settings: the `--workers` flag over the file's and the environment's `server.workers`."""

from __future__ import annotations

import os

import pytest
import typer

from switchyard.cli import WORKERS_ENV, serve_settings

NO_VALKEY = "models:\n  - {name: m, base_url: 'http://127.0.0.1:9/v1'}\nbilling: {ledger_path: null, redis_url: none}\n"


def test_the_flag_wins_over_a_files_workers_that_needs_valkey(tmp_path, monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    config = tmp_path / "switchyard.yaml"
    config.write_text(NO_VALKEY + "server: {workers: 3}\n")
    assert serve_settings(config, 1).server.workers == 1
    assert WORKERS_ENV not in os.environ  # put back as it was
    with pytest.raises(typer.Exit) as refused:  # without the flag, the file's 3 is refused
        serve_settings(config, None)
    assert refused.value.exit_code == 2


def test_the_flag_wins_over_the_environment_and_leaves_it_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv(WORKERS_ENV.lower(), "4")  # the settings read the environment case-insensitively
    config = tmp_path / "switchyard.yaml"
    config.write_text(NO_VALKEY)
    assert serve_settings(config, 1).server.workers == 1
    assert os.environ[WORKERS_ENV.lower()] == "4" and WORKERS_ENV not in os.environ
    with pytest.raises(typer.Exit) as refused:  # the flag's own number is still checked
        serve_settings(config, 2)
    assert refused.value.exit_code == 2
