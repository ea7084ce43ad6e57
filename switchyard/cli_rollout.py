"""`switchyard rollout promote` and `switchyard rollout rollback`: the candidate routing version
made current, or taken back, on the files the config names (`switchyard.gateway.rollout_files`);
with `--url`, the running proxy is then asked to reload them (`POST /admin/reload`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from switchyard.backends.defaults import load_settings
from switchyard.core.settings import DEFAULT_CONFIG_NAME, ConfigError, Settings
from switchyard.evals.cli_support import cli_error
from switchyard.gateway.rollout_files import Moved, RolloutError, promote, rollback

ADMIN_KEY_ENV = "SWITCHYARD_ADMIN_KEY"

rollout_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="A candidate routing version: promote it, or roll back."
)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"YAML config file (its routing and rollout sections). Default: ./{DEFAULT_CONFIG_NAME} if present.",
        dir_okay=False,
    ),
]
UrlOption = Annotated[
    str | None,
    typer.Option("--url", help="The running proxy (e.g. http://127.0.0.1:8080): ask it to reload afterwards."),
]
AdminKeyOption = Annotated[
    str | None,
    typer.Option("--admin-key", envvar=ADMIN_KEY_ENV, help=f"auth.admin_key of the proxy (or ${ADMIN_KEY_ENV})."),
]


@rollout_app.command("promote")
def promote_command(config: ConfigOption = None, url: UrlOption = None, admin_key: AdminKeyOption = None) -> None:
    """The candidate becomes the current thresholds file (the old one kept for a rollback)."""
    _run(promote, config, url, admin_key)


@rollout_app.command("rollback")
def rollback_command(config: ConfigOption = None, url: UrlOption = None, admin_key: AdminKeyOption = None) -> None:
    """Withdraw the candidate in rollout; with none, undo the last promotion."""
    _run(rollback, config, url, admin_key)


def _run(action, config: Path | None, url: str | None, admin_key: str | None) -> None:
    settings = _settings(config)
    try:
        moved: Moved = action(settings)
    except (RolloutError, OSError) as exc:
        raise cli_error(str(exc)) from exc
    for line in moved.lines:
        typer.echo(line)
    if url is not None:
        typer.echo(_reload(url, admin_key))


def _settings(config: Path | None) -> Settings:
    if config is None and Path(DEFAULT_CONFIG_NAME).is_file():
        config = Path(DEFAULT_CONFIG_NAME)
    if config is None:
        raise cli_error(f"no config: pass --config FILE (or run where ./{DEFAULT_CONFIG_NAME} is)")
    try:
        return load_settings(config)
    except ConfigError as exc:
        raise cli_error(str(exc)) from exc


def _reload(url: str, admin_key: str | None) -> str:
    """Ask the proxy at `url` to reload; what it now routes by (an error exits with status 2)."""
    if admin_key is None:
        raise cli_error(f"the files are changed; to reload the proxy, pass --admin-key (or set ${ADMIN_KEY_ENV})")
    request = urllib.request.Request(
        url.rstrip("/") + "/admin/reload", method="POST", headers={"authorization": f"Bearer {admin_key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - the operator's own URL
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise cli_error(f"the files are changed, but {url} refused to reload ({exc.code}): {_message(exc)}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise cli_error(f"the files are changed, but {url} could not be asked to reload: {exc}") from exc
    text = f"{url} reloaded: routing by {body['current']['version']}"
    if body.get("candidate"):
        text += f", candidate {body['candidate']['version']} on {body['candidate']['share']:.0%}"
    return text


def _message(error: urllib.error.HTTPError) -> str:
    """The message of an error in OpenAI's shape, else the start of the body."""
    text = error.read().decode(errors="replace")
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text[:500]
