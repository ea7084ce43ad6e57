"""`switchyard eval cascade`: fit the cascade's confidence scorer and threshold on a trace file's
train split, write the rung into a thresholds file, report on the test split (tables or JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from switchyard.evals.cli_support import cli_error


def cascade(
    traces: Annotated[
        Path, typer.Option("--traces", "-t", help="A trace file (.jsonl[.gz]) with weak-model logprobs.")
    ],
    weak: Annotated[str | None, typer.Option(help="The cheap rung (default: from the file).")] = None,
    strong: Annotated[str | None, typer.Option(help="The rung it escalates to (default: from the file).")] = None,
    target_quality: Annotated[
        float | None,
        typer.Option(help="Reach this fraction of the strong model's quality, as cheaply as possible (default 0.95)."),
    ] = None,
    max_cost: Annotated[
        float | None, typer.Option(help="Best quality at a mean cost of at most this many USD per prompt.")
    ] = None,
    best_quality: Annotated[
        bool, typer.Option("--best-quality", help="The highest quality on the train curve, as cheaply as possible.")
    ] = False,
    scorer: Annotated[
        str, typer.Option(help="auto (best train AUROC), learned, or one confidence feature (e.g. p10_logprob).")
    ] = "auto",
    first_k: Annotated[int, typer.Option(min=1, help="The 'first k tokens' of the first_* features.")] = 16,
    out: Annotated[Path, typer.Option(help="Thresholds file to write (other sections and rungs are kept).")] = Path(
        "thresholds.yaml"
    ),
    report_dir: Annotated[Path, typer.Option("--report", help="Folder for the PNG plot and the HTML page.")] = Path(
        "eval-out"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout instead of tables.")] = False,
) -> None:
    """Fit the cascade's confidence scorer and threshold on the train split; report on the test split."""
    if sum(x is not None for x in (target_quality, max_cost)) + best_quality > 1:
        raise cli_error("give at most one of --target-quality, --max-cost or --best-quality")
    if target_quality is None and max_cost is None and not best_quality:
        target_quality = 0.95
    goal = {"quality_fraction": target_quality, "max_cost_usd": max_cost, "best_quality": best_quality}
    report, rung = _tune(traces, weak, strong, scorer, first_k, goal)
    write_rung(out, report.weak, rung)
    png, page = _write_report(report_dir, traces, report)
    if as_json:
        _print_json(report.to_json(), out, png, page)
        return
    _print_tables(report, out, png, page)


def _tune(traces: Path, weak: str | None, strong: str | None, scorer: str, first_k: int, goal: dict[str, Any]):
    """The tuned cascade (its notes saying how the file was split) and the rung to write for it."""
    import numpy as np

    from switchyard.core.traces import TraceFormatError, read_traces, traces_digest
    from switchyard.evals.cascade import CascadeData, tune
    from switchyard.evals.datasets import assign_splits
    from switchyard.evals.drift_reference import escalation_reference
    from switchyard.evals.evaluate import EvalError, resolve_models

    try:
        loaded, meta = read_traces(traces)
        weak, strong = resolve_models(loaded, meta, weak, strong)
        notes = []
        if not any(t.split == "train" for t in loaded):
            assign_splits(loaded)
            notes.append("the file has no train split: split 80/20 by prompt hash")
        train = CascadeData.of([t for t in loaded if t.split == "train"], weak, strong, first_k)
        test = CascadeData.of([t for t in loaded if t.split == "test"], weak, strong, first_k)
        report = tune(train, test, weak, strong, scorer_name=scorer, first_k=first_k, **goal)
    except (TraceFormatError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    report.notes += notes
    result = report.to_json()
    rung = {
        "strong_model": strong,
        "scorer": result["scorer"],
        "threshold": result["threshold"],
        "target": result["target"],
        "data": {
            "source": meta.get("source", str(traces)),
            "sha256": traces_digest(loaded),
            "num_train": len(train.traces),
            "num_test": len(test.traces),
        },
        "train": report.train,
        "test": report.test,
        "reference": escalation_reference(
            np.concatenate([train.confidence(report.scorer), test.confidence(report.scorer)]), report.threshold
        ),
    }
    return report, rung


def write_rung(out: Path, weak: str, rung: dict[str, Any]) -> None:
    """`rung` as `cascade.rungs.<weak>` of the thresholds file, its other rungs and sections kept."""
    from switchyard.core.thresholds import ThresholdsError, read_thresholds, write_section

    try:
        existing = read_thresholds(out).cascade if out.exists() else None
        rungs = {name: r.model_dump() for name, r in existing.rungs.items()} if existing is not None else {}
        rungs[weak] = rung
        write_section(out, "cascade", {"rungs": rungs})
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc


def _write_report(report_dir: Path, traces: Path, report) -> tuple[Path, Path]:
    """The PNG plot and the HTML page of the tuned cascade; their paths."""
    from switchyard.evals import cascade_report

    report_dir.mkdir(parents=True, exist_ok=True)
    stem = traces.name.split(".")[0]
    png, page = report_dir / f"cascade-{stem}.png", report_dir / f"cascade-{stem}.html"
    title = f"Cascade on {traces.name}: {report.weak} → {report.strong}"
    cascade_report.write_plot(png, title, report)
    cascade_report.write_html(page, title, report)
    return png, page


def _print_json(result: dict[str, Any], out: Path, png: Path, page: Path) -> None:
    import orjson

    typer.echo(orjson.dumps({**result, "thresholds_file": str(out), "plot": str(png), "html": str(page)}).decode())


def _print_tables(report, out: Path, png: Path, page: Path) -> None:
    from rich.console import Console

    from switchyard.evals import cascade_report

    console = Console()
    console.print(cascade_report.auroc_table(report))
    for line in cascade_report.summary_lines(report):
        console.print(line, highlight=False)
    console.print(f"wrote {out} (cascade.rungs.{report.weak}), {png} and {page}")
