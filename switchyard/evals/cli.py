"""`switchyard eval …`: offline evaluation of routing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.evals.cache_cli import cache
from switchyard.evals.cascade_cli import cascade
from switchyard.evals.cli_support import DatasetOption, cli_error, dataset_label, load_set, progress_bar
from switchyard.evals.collect_cli import collect
from switchyard.evals.retune_cli import retune
from switchyard.evals.route_artifacts import compare_artifacts
from switchyard.evals.tiers_cli import tiers

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Offline evaluation of routing, cascading and the response cache."
)

WeakOption = Annotated[str | None, typer.Option(help="Weak model in the traces (default: from the data).")]
StrongOption = Annotated[str | None, typer.Option(help="Strong model in the traces (default: from the data).")]


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
        compare_artifacts(artifacts, dataset or [], weak, strong)
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
        traces, meta, weak, strong = load_set(dataset, weak, strong)
        progress.update(loading, completed=1)
        scoring = progress.add_task("scoring routers", total=len(routers))
        try:
            test, results = evaluate_routers(
                routers, traces, weak, strong, on_step=lambda name: progress.advance(scoring)
            )
        except EvalError as exc:
            raise cli_error(str(exc)) from exc
    label = dataset_label(dataset)
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

    if (target_quality is None) == (max_strong_share is None):
        raise cli_error("give exactly one of --target-quality or --max-strong-share")
    traces, meta, weak, strong = load_set(dataset, weak, strong)
    value, (num_train, train_point), (num_test, test_point), reference = _pick_threshold(
        traces, router, weak, strong, target_quality, max_strong_share
    )
    target = (
        {"quality_fraction": target_quality} if target_quality is not None else {"max_strong_share": max_strong_share}
    )
    section = {
        "router": router,
        "threshold": value,
        "weak_model": weak,
        "strong_model": strong,
        "target": target,
        "data": {
            "source": meta.get("source", dataset),
            "sha256": traces_digest(traces),
            "num_train": num_train,
            "num_test": num_test,
        },
        "train": train_point,
        "test": test_point,
        "reference": reference,
    }
    try:
        write_section(out, "routing", section, keep=("by_value",))
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    _print_threshold(f"{router}: route to {strong} when score >= {value:.6g}", train_point, test_point)
    typer.echo(f"wrote {out}")


def _pick_threshold(traces, router: str, weak: str, strong: str, quality: float | None, share: float | None):
    """Fit `router` on the train split, pick its threshold there: the threshold, each split's
    (number of prompts, operating point at it), the test's with the router's APGR, and the drift
    reference of both splits' scores."""
    import numpy as np

    from switchyard.evals import metrics
    from switchyard.evals.drift_reference import strong_share_reference
    from switchyard.evals.evaluate import EvalError, Outcomes, split
    from switchyard.evals.routers import make_router
    from switchyard.evals.thresholds import operating_point, pick_threshold

    try:
        chosen = make_router(router)
        train, test = (
            Outcomes.of(split(traces, "train"), weak, strong),
            Outcomes.of(split(traces, "test"), weak, strong),
        )
        chosen.fit(train.traces, weak, strong)
        train_scores, test_scores = chosen.score(train.traces), chosen.score(test.traces)
        value = pick_threshold(train, train_scores, quality_fraction=quality, max_strong_share=share)
    except (ValueError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    test_point = operating_point(test, test_scores, value)
    test_point["apgr"] = round(metrics.apgr(test.curve(test_scores), test.quality_weak, test.quality_strong), 6)
    train_point = operating_point(train, train_scores, value)
    reference = strong_share_reference(np.concatenate([train_scores, test_scores]), value)
    return value, (len(train.traces), train_point), (len(test.traces), test_point), reference


def _print_threshold(headline: str, train_point: dict, test_point: dict) -> None:
    typer.echo(headline)
    for name, point in (("train", train_point), ("test", test_point)):
        typer.echo(
            f"  {name:5}: {point['strong_share'] * 100:.1f}% strong calls, quality {point['quality']:.3f} "
            f"(PGR {point['pgr']:.3f}), ${point['cost_usd_per_1k']:.4f} / 1k prompts"
        )


app.command()(tiers)  # switchyard/evals/tiers_cli.py
app.command()(cascade)  # switchyard/evals/cascade_cli.py
app.command()(collect)  # switchyard/evals/collect_cli.py
app.command()(retune)  # switchyard/evals/retune_cli.py
app.command()(cache)  # switchyard/evals/cache_cli.py
