"""The `switchyard` command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from evals.cli import app as eval_app
from proxy.settings import DEFAULT_CONFIG_NAME, ConfigError, load_settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Switchyard: an LLM routing proxy.")
app.add_typer(eval_app, name="eval")

ConfigOption = Annotated[
    Optional[Path],  # noqa: UP045 - typer reads the annotation at run time
    typer.Option(
        "--config",
        "-c",
        help=f"YAML config file. Default: ./{DEFAULT_CONFIG_NAME} if present, else the built-in default.",
        dir_okay=False,
    ),
]


def _resolve_config(config: Path | None) -> Path | None:
    if config is not None:
        return config
    local = Path(DEFAULT_CONFIG_NAME)
    return local if local.is_file() else None


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[Optional[str], typer.Option(help="Overrides server.host.")] = None,  # noqa: UP045
    port: Annotated[Optional[int], typer.Option(help="Overrides server.port.")] = None,  # noqa: UP045
) -> None:
    """Run the proxy."""
    import uvicorn

    from evals.thresholds_file import ThresholdsError
    from proxy.app import create_app

    try:
        settings = load_settings(_resolve_config(config))
    except ConfigError as exc:
        typer.echo(f"switchyard: {exc}", err=True)
        raise typer.Exit(2) from exc
    if host is not None:
        settings.server.host = host
    if port is not None:
        settings.server.port = port
    try:
        app_ = create_app(settings)
    except ThresholdsError as exc:
        typer.echo(f"switchyard: {exc}", err=True)
        raise typer.Exit(2) from exc
    uvicorn.run(
        app_,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        access_log=settings.server.access_log,
        loop="uvloop" if os.name == "posix" else "auto",
        http="httptools",
        timeout_graceful_shutdown=5,
    )


@app.command("check-config")
def check_config(config: ConfigOption = None) -> None:
    """Validate a config file and print what it resolves to (secrets masked)."""
    import yaml

    try:
        settings = load_settings(_resolve_config(config))
    except ConfigError as exc:
        typer.echo(f"switchyard: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True), sort_keys=False))


if __name__ == "__main__":
    app()
