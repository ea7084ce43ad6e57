"""`switchyard eval …`: offline evaluation of routing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.evals.cli_support import DatasetOption, cli_error, progress_bar
from switchyard.evals.tiers_cli import tiers

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Offline evaluation of routing and cascading.")

WeakOption = Annotated[str | None, typer.Option(help="Weak model in the traces (default: from the data).")]
StrongOption = Annotated[str | None, typer.Option(help="Strong model in the traces (default: from the data).")]


def _load(dataset: str, weak: str | None, strong: str | None):
    from switchyard.core.traces import TraceFormatError
    from switchyard.evals.datasets import load_dataset
    from switchyard.evals.evaluate import EvalError, resolve_models

    try:
        traces, meta = load_dataset(dataset)
        weak, strong = resolve_models(traces, meta, weak, strong)
    except (TraceFormatError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    return traces, meta, weak, strong


@app.command()
def route(
    dataset: Annotated[
        list[str] | None,
        typer.Option(
            "--dataset",
            "-d",
            help="mmlu, gsm8k, llmrouter, arena, vicuna80, or a trace file (.jsonl[.gz]). "
            "Repeatable with --artifacts (default there: arena, vicuna80, mmlu, gsm8k, llmrouter).",
        ),
    ] = None,
    router: Annotated[
        list[str] | None, typer.Option("--router", "-r", help="Router to compare (repeatable). Default: all baselines.")
    ] = None,
    weak: WeakOption = None,
    strong: StrongOption = None,
    out: Annotated[Path, typer.Option(help="Folder for the PNG plot and the HTML page.")] = Path("eval-out"),
    plot: Annotated[
        bool, typer.Option("--plot/--no-plot", help="Draw the quality-vs-strong-share and cost curves (PNG, HTML).")
    ] = True,
    artifacts: Annotated[
        list[str] | None,
        typer.Option(
            "--artifacts",
            help="'all' (every shipped classifier artifact) or artifact folders (repeatable): instead of the "
            "routers, one table of the artifacts on each set's prompts none of them was fitted on, chat sets "
            "first, with bootstrap intervals and each one's difference from the default. No plot.",
        ),
    ] = None,
) -> None:
    """Compare routers on the test split: APGR, CPT(50%), CPT(80%), cost at 95% quality; plot the curves."""
    if artifacts:
        if router:
            raise cli_error("--router and --artifacts do not go together: --artifacts compares classifier artifacts")
        _compare_artifacts(artifacts, dataset or [], weak, strong)
        return
    if not dataset:
        raise cli_error("give --dataset (or --artifacts to compare the classifier artifacts)")
    if len(dataset) > 1:
        raise cli_error("one --dataset at a time, unless with --artifacts")
    _route(dataset[0], router, weak, strong, out, plot)


def _route(dataset: str, router: list[str] | None, weak, strong, out: Path, plot: bool) -> None:
    from rich.console import Console

    from switchyard.evals import report
    from switchyard.evals.evaluate import EvalError, evaluate_routers
    from switchyard.evals.routers import DEFAULT_ROUTERS, make_router

    console = Console()
    names = router or list(DEFAULT_ROUTERS)
    try:
        routers = [make_router(name) for name in names]
    except ValueError as exc:
        raise cli_error(str(exc)) from exc
    with progress_bar(console) as progress:
        loading = progress.add_task(f"loading {dataset}", total=1)
        traces, meta, weak, strong = _load(dataset, weak, strong)
        progress.update(loading, completed=1)
        scoring = progress.add_task("scoring routers", total=len(routers))
        try:
            test, results = evaluate_routers(
                routers, traces, weak, strong, on_step=lambda name: progress.advance(scoring)
            )
        except EvalError as exc:
            raise cli_error(str(exc)) from exc
    label = Path(dataset).name if Path(dataset).exists() else dataset
    title = f"Routing on {label}: {weak} → {strong}"
    console.print(report.rich_table(title, results))
    console.print(report.anchors(test))
    if meta.get("note"):
        console.print(f"note: {meta['note']}")
    if not plot:
        return
    out.mkdir(parents=True, exist_ok=True)
    stem = label.split(".")[0]
    png, page = out / f"route-{stem}.png", out / f"route-{stem}.html"
    report.write_plot(png, title, test, results)
    report.write_html(page, title, test, results)
    console.print(f"wrote {png} and {page}")


def _compare_artifacts(specs: list[str], datasets: list[str], weak: str | None, strong: str | None) -> None:
    from rich.console import Console

    from switchyard.classifier.model import ARTIFACTS, DEFAULT_ARTIFACT, ArtifactError, ComplexityClassifier
    from switchyard.classifier.router import ClassifierRouter
    from switchyard.evals import artifact_compare, report
    from switchyard.evals.datasets import CHAT_SETS
    from switchyard.evals.evaluate import EvalError, Outcomes

    if (weak or strong) and len(datasets) != 1:
        raise cli_error("--weak and --strong name one set's models: give one --dataset with them")
    folders = [
        folder
        for spec in specs
        for folder in (
            artifact_compare.shipped_artifacts(ARTIFACTS, DEFAULT_ARTIFACT) if spec == "all" else [Path(spec)]
        )
    ]
    folders = list(dict.fromkeys(folders))
    labels = [folder.name for folder in folders]
    if len(set(labels)) != len(labels):
        raise cli_error(f"two artifact folders share a name: {', '.join(labels)}")
    try:
        metadatas = [ComplexityClassifier.read_metadata(folder) for folder in folders]
    except ArtifactError as exc:
        raise cli_error(str(exc)) from exc
    default_label = DEFAULT_ARTIFACT.name
    reference = default_label if default_label in labels else labels[0]
    console = Console()
    results = []
    with progress_bar(console) as progress:
        loading = progress.add_task("loading artifacts", total=len(folders))
        routers = {}
        for label, folder in zip(labels, folders, strict=True):
            try:
                routers[label] = ClassifierRouter(folder)
            except ArtifactError as exc:
                raise cli_error(str(exc)) from exc
            progress.advance(loading)
        names = artifact_compare.chat_first(datasets or list(artifact_compare.DEFAULT_SETS))
        scoring = progress.add_task("scoring sets", total=len(names))
        for name in names:
            traces, _, set_weak, set_strong = _load(name, weak, strong)
            label = Path(name).name if Path(name).exists() else name
            kept, which = artifact_compare.held_out(traces, (name, label), metadatas)
            try:
                outcomes = Outcomes.of(kept, set_weak, set_strong)
            except EvalError as exc:
                raise cli_error(f"{name}: {exc}") from exc
            scores = {artifact: r.score(outcomes.traces) for artifact, r in routers.items()}
            results.append(
                artifact_compare.SetResult(
                    dataset=label,
                    is_chat=name in CHAT_SETS,
                    weak=set_weak,
                    strong=set_strong,
                    num_prompts=len(outcomes.traces),
                    which_prompts=which,
                    artifacts=artifact_compare.compare(outcomes, scores, reference),
                )
            )
            progress.advance(scoring)
    console.print(report.artifacts_table(results, reference))
    for line in report.set_lines(results):
        console.print(line, highlight=False)
    best = artifact_compare.best_on_chat(results)
    if best is not None:
        console.print(
            f"best on chat (APGR averaged over {', '.join(r.dataset for r in results if r.is_chat)}): "
            f"{best[0]} ({best[1]:.3f}); the default: {default_label}",
            highlight=False,
        )


@app.command()
def thresholds(
    dataset: DatasetOption,
    router: Annotated[str, typer.Option("--router", "-r", help="The router whose threshold to pick.")],
    target_quality: Annotated[
        float | None, typer.Option(help="Reach this fraction of the strong model's quality (e.g. 0.95).")
    ] = None,
    max_strong_share: Annotated[
        float | None, typer.Option(help="Send at most this share of prompts to the strong model (e.g. 0.3).")
    ] = None,
    weak: WeakOption = None,
    strong: StrongOption = None,
    out: Annotated[Path, typer.Option(help="Thresholds file to write (its other sections are kept).")] = Path(
        "thresholds.yaml"
    ),
) -> None:
    """Pick a routing threshold on the train split and write it, with train and test metrics, to a file."""
    from switchyard.core.thresholds import ThresholdsError, write_section
    from switchyard.core.traces import traces_digest
    from switchyard.evals import metrics
    from switchyard.evals.evaluate import EvalError, Outcomes, split
    from switchyard.evals.routers import make_router
    from switchyard.evals.thresholds import operating_point, pick_threshold

    if (target_quality is None) == (max_strong_share is None):
        raise cli_error("give exactly one of --target-quality or --max-strong-share")
    traces, meta, weak, strong = _load(dataset, weak, strong)
    try:
        chosen = make_router(router)
        train, test = (
            Outcomes.of(split(traces, "train"), weak, strong),
            Outcomes.of(split(traces, "test"), weak, strong),
        )
        chosen.fit(train.traces, weak, strong)
        train_scores, test_scores = chosen.score(train.traces), chosen.score(test.traces)
        value = pick_threshold(train, train_scores, quality_fraction=target_quality, max_strong_share=max_strong_share)
    except (ValueError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    target = (
        {"quality_fraction": target_quality} if target_quality is not None else {"max_strong_share": max_strong_share}
    )
    test_point = operating_point(test, test_scores, value)
    test_point["apgr"] = round(metrics.apgr(test.curve(test_scores), test.quality_weak, test.quality_strong), 6)
    train_point = operating_point(train, train_scores, value)
    section = {
        "router": router,
        "threshold": value,
        "weak_model": weak,
        "strong_model": strong,
        "target": target,
        "data": {
            "source": meta.get("source", dataset),
            "sha256": traces_digest(traces),
            "num_train": len(train.traces),
            "num_test": len(test.traces),
        },
        "train": train_point,
        "test": test_point,
    }
    try:
        write_section(out, "routing", section, keep=("by_value",))
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    typer.echo(f"{router}: route to {strong} when score >= {value:.6g}")
    for name, point in (("train", train_point), ("test", test_point)):
        typer.echo(
            f"  {name:5}: {point['strong_share'] * 100:.1f}% strong calls, quality {point['quality']:.3f} "
            f"(PGR {point['pgr']:.3f}), ${point['cost_usd_per_1k']:.4f} / 1k prompts"
        )
    typer.echo(f"wrote {out}")


app.command()(tiers)  # switchyard/evals/tiers_cli.py


@app.command()
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
    import orjson

    from switchyard.core.thresholds import ThresholdsError, read_thresholds, write_section
    from switchyard.core.traces import TraceFormatError, read_traces, traces_digest
    from switchyard.evals import cascade_report
    from switchyard.evals.cascade import CascadeData, tune
    from switchyard.evals.datasets import assign_splits
    from switchyard.evals.evaluate import EvalError, resolve_models

    if sum(x is not None for x in (target_quality, max_cost)) + best_quality > 1:
        raise cli_error("give at most one of --target-quality, --max-cost or --best-quality")
    if target_quality is None and max_cost is None and not best_quality:
        target_quality = 0.95
    try:
        loaded, meta = read_traces(traces)
        weak, strong = resolve_models(loaded, meta, weak, strong)
        notes = []
        if not any(t.split == "train" for t in loaded):
            assign_splits(loaded)
            notes.append("the file has no train split: split 80/20 by prompt hash")
        train = CascadeData.of([t for t in loaded if t.split == "train"], weak, strong, first_k)
        test = CascadeData.of([t for t in loaded if t.split == "test"], weak, strong, first_k)
        report = tune(
            train,
            test,
            weak,
            strong,
            scorer_name=scorer,
            first_k=first_k,
            quality_fraction=target_quality,
            max_cost_usd=max_cost,
            best_quality=best_quality,
        )
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
    }
    try:
        existing = read_thresholds(out).cascade if out.exists() else None
        rungs = {name: r.model_dump() for name, r in existing.rungs.items()} if existing is not None else {}
        rungs[weak] = rung
        write_section(out, "cascade", {"rungs": rungs})
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    report_dir.mkdir(parents=True, exist_ok=True)
    stem = traces.name.split(".")[0]
    png, page = report_dir / f"cascade-{stem}.png", report_dir / f"cascade-{stem}.html"
    title = f"Cascade on {traces.name}: {weak} → {strong}"
    cascade_report.write_plot(png, title, report)
    cascade_report.write_html(page, title, report)
    if as_json:
        typer.echo(orjson.dumps({**result, "thresholds_file": str(out), "plot": str(png), "html": str(page)}).decode())
        return
    from rich.console import Console

    console = Console()
    console.print(cascade_report.auroc_table(report))
    for line in cascade_report.summary_lines(report):
        console.print(line, highlight=False)
    console.print(f"wrote {out} (cascade.rungs.{weak}), {png} and {page}")


@app.command()
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
    import asyncio

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from switchyard.backends.defaults import load_settings
    from switchyard.core.settings import ConfigError
    from switchyard.evals.collect import CollectError, collect_with_settings, load_items, sample

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
    chosen = sample(items, limit)
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        loading = progress.add_task(f"starting {', '.join(names)}", total=None)
        answering = progress.add_task("answers", total=len(chosen) * len(names), visible=False)

        def ready() -> None:
            progress.update(loading, visible=False)
            progress.update(answering, visible=True)

        try:
            written, skipped, failures = asyncio.run(
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
    for failure in failures[:10]:
        console.print(f"failed: {failure}", highlight=False)
    typer.echo(
        f"wrote {written} prompts to {out} ({skipped} already complete"
        + (f", {len(failures)} answers failed: run again to retry them" if failures else "")
        + ")"
    )
    if failures:
        raise typer.Exit(1)
