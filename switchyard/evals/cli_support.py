"""What every `switchyard` subcommand does with an error the user can fix: say it, exit 2."""

from typing import Annotated

import typer

DatasetOption = Annotated[
    str, typer.Option("--dataset", "-d", help="mmlu, gsm8k, llmrouter, arena, vicuna80, or a trace file (.jsonl[.gz]).")
]


def cli_error(message: str) -> typer.Exit:
    """Print `switchyard: message` to stderr; raise the returned Exit (status 2)."""
    typer.echo(f"switchyard: {message}", err=True)
    return typer.Exit(2)


def progress_bar(console):
    """The evals' progress bar: what runs, a bar, done/total, time so far; gone when done."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
