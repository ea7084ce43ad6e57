"""What every `switchyard` subcommand does with an error the user can fix (say it, exit 2), and
the dataset loading and progress bar the eval commands share."""

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


def dataset_label(dataset: str) -> str:
    """How a `--dataset` value is shown: a trace file by its file name, a shipped set by its name."""
    from pathlib import Path

    return Path(dataset).name if Path(dataset).exists() else dataset


def load_set(dataset: str, weak: str | None, strong: str | None):
    """A dataset's traces, header and (weak, strong) pair; a bad file or pair is a CLI error."""
    from switchyard.core.traces import TraceFormatError
    from switchyard.evals.datasets import load_dataset
    from switchyard.evals.evaluate import EvalError, resolve_models

    try:
        traces, meta = load_dataset(dataset)
        weak, strong = resolve_models(traces, meta, weak, strong)
    except (TraceFormatError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    return traces, meta, weak, strong
