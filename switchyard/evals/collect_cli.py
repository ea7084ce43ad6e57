"""`switchyard eval collect`: answer a dataset with configured models, grade, write traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.evals.cli_support import cli_error


def collect(
    dataset: Annotated[
        str, typer.Option("--dataset", "-d", help='gsm8k, mmlu, or a JSONL file of {"id", "prompt", "answer"}.')
    ],
    models: Annotated[str, typer.Option(help="Comma-separated model names from the config, cheapest first.")],
    out: Annotated[Path, typer.Option(help="Trace file to write or resume (.jsonl).")] = Path("traces.jsonl"),
    limit: Annotated[int | None, typer.Option(min=1, help="Answer at most this many prompts (a fixed sample).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Switchyard config (default: the embedded models).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Answer budget per prompt.")] = 256,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at once.")] = 4,
) -> None:
    """Answer a dataset with configured models (logprobs on), grade the answers, write traces; resumable."""
    from rich.console import Console

    from switchyard.backends.defaults import load_settings
    from switchyard.core.settings import ConfigError
    from switchyard.evals.collect import CollectError, load_items, sample

    if out.suffix == ".gz":
        raise cli_error("collect appends as it goes: write a plain .jsonl (compress it afterwards)")
    names = [name.strip() for name in models.split(",") if name.strip()]
    if not names:
        raise cli_error("--models names no model")
    try:
        settings = load_settings(config)
        items, source = load_items(dataset)
    except (ConfigError, CollectError) as exc:
        raise cli_error(str(exc)) from exc
    console = Console(stderr=True)
    answered = _answer(console, settings, names, sample(items, limit), out, source, max_tokens, concurrency)
    _print_summary(console, out, *answered)


def _answer(console, settings, names: list[str], chosen, out: Path, source, max_tokens: int, concurrency: int):
    """Collect with a progress bar (`starting …` until the models are up, then the answers):
    (prompts written, prompts already complete, failed answers)."""
    import asyncio

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from switchyard.evals.collect import CollectError, collect_with_settings

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        loading = progress.add_task(f"starting {', '.join(names)}", total=None)
        answering = progress.add_task("answers", total=len(chosen) * len(names), visible=False)

        def ready() -> None:
            progress.update(loading, visible=False)
            progress.update(answering, visible=True)

        try:
            return asyncio.run(
                collect_with_settings(
                    settings,
                    names,
                    chosen,
                    out,
                    source,
                    max_tokens=max_tokens,
                    concurrency=concurrency,
                    on_ready=ready,
                    on_answer=lambda: progress.advance(answering),
                )
            )
        except CollectError as exc:
            raise cli_error(str(exc)) from exc


def _print_summary(console, out: Path, written: int, skipped: int, failures: list) -> None:
    """The first failures, what was written; exit 1 if any answer failed."""
    for failure in failures[:10]:
        console.print(f"failed: {failure}", highlight=False)
    typer.echo(
        f"wrote {written} prompts to {out} ({skipped} already complete"
        + (f", {len(failures)} answers failed: run again to retry them" if failures else "")
        + ")"
    )
    if failures:
        raise typer.Exit(1)
