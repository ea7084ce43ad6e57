"""`switchyard eval tiers`: route N tiers by value on labelled data, each quality mode's tolerance
picked where the artifact did not learn, the test beside each tier alone, a plot of quality against cost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from switchyard.evals.cli_support import DatasetOption, cli_error, dataset_label, progress_bar


def tiers(
    dataset: DatasetOption,
    tier: Annotated[
        list[str],
        typer.Option("--tier", help="NAME=MODEL, repeatable, cheapest first: a tier and the model it is in the data."),
    ],
    artifact: Annotated[
        Path | None, typer.Option(help="Classifier artifact (default: the shipped one that predicts quality).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for the PNG plot.")] = Path("eval-out"),
    thresholds_out: Annotated[
        Path | None, typer.Option(help="Write routing.by_value (tier models, tolerances) into this thresholds file.")
    ] = None,
) -> None:
    """Route among N tiers by value on labelled data: pick each quality mode's tolerance on the
    train split, report the test split beside each tier alone, plot quality against cost."""
    from rich.console import Console

    from switchyard.classifier.model import BY_VALUE_ARTIFACT, ArtifactError, ComplexityClassifier
    from switchyard.evals import tiers as by_value

    pairs = _parse_tiers(tier)
    names, models = [name for name, _ in pairs], [model for _, model in pairs]
    artifact = artifact or BY_VALUE_ARTIFACT
    try:
        ComplexityClassifier.check_quality_models(artifact, models)
    except ArtifactError as exc:
        raise cli_error(str(exc)) from exc
    console = Console()
    label, meta, splits, where = _load_splits(console, dataset, artifact, models)
    classifier = ComplexityClassifier.load(artifact)
    predicted = {name: _predict(console, classifier, data, models, name) for name, data in splits.items()}
    train, test = splits["tuning"], splits["test"]
    modes = by_value.tune_modes(train, predicted["tuning"], test, predicted["test"], names)
    title = f"By value on {label} (test, {len(test.traces)} prompts): " + " < ".join(names)
    console.print(_table(title, test, names, models, modes))
    for line in _summary_lines(test, names, modes):
        console.print(line)
    png = _write_plot(out / f"tiers-{label.split('.')[0]}.png", title, test, predicted["test"], names, modes)
    console.print(f"wrote {png}")
    if thresholds_out is not None:
        data = {
            "source": meta.get("source", dataset),
            "tolerances": where,
            "num_tuning": len(train.traces),
            "num_test": len(test.traces),
        }
        _write_section(thresholds_out, dict(pairs), artifact, data, modes)
        console.print(f"wrote routing.by_value to {thresholds_out}")


def _parse_tiers(tier: list[str]) -> list[tuple[str, str]]:
    """The `--tier NAME=MODEL` values as (name, model), cheapest first; at least two, each name once."""
    pairs = [spec.split("=", 1) for spec in tier]
    bad = [spec for spec, pair in zip(tier, pairs, strict=True) if len(pair) != 2 or not all(pair)]
    if bad:
        raise cli_error(f"--tier takes NAME=MODEL, not {bad[0]!r}")
    names = [name for name, _ in pairs]
    if len(pairs) < 2 or len(set(names)) != len(names):
        raise cli_error("give at least two --tier NAME=MODEL, each name once")
    return [(name, model) for name, model in pairs]


def _load_splits(console, dataset: str, artifact: Path, models: list[str]):
    """The dataset's label and header, its tuning and test `TierData`, and where the tolerances are
    picked (saying so, and how many prompts lack a tier's outcome)."""
    from switchyard.classifier.model import ComplexityClassifier
    from switchyard.core.traces import TraceFormatError
    from switchyard.evals import tiers as by_value
    from switchyard.evals.datasets import load_dataset

    try:
        traces, meta = load_dataset(dataset)
    except TraceFormatError as exc:
        raise cli_error(str(exc)) from exc
    label = dataset_label(dataset)
    seen = label in ComplexityClassifier.read_metadata(artifact).get("data", {}).get("datasets", [])
    tuning_traces, test_traces, where = by_value.tuning_and_test(traces, seen)
    splits = {"tuning": by_value.TierData.of(tuning_traces, models), "test": by_value.TierData.of(test_traces, models)}
    missing = [m for m in models if not any(m in t.models for t in traces)]
    if missing or not all(len(data.traces) for data in splits.values()):
        raise cli_error(f"{dataset} has no prompts graded for {', '.join(missing or models)} in both splits")
    dropped = len(tuning_traces) + len(test_traces) - sum(len(data.traces) for data in splits.values())
    if dropped:
        console.print(f"{dropped} prompts lack an outcome for some tier's model and are left out")
    console.print(f"tolerances {where}")
    return label, meta, splits, where


def _table(title: str, test, names: list[str], models: list[str], modes: dict[str, dict[str, Any]]):
    """Each tier alone, then each mode routed by value, on the test split."""
    from rich.table import Table

    from switchyard.evals.tiers import random_at

    table = Table(title=title)
    for column in (
        "routing",
        "tolerance",
        "quality",
        "random, same cost",
        "USD / 1k prompts",
        *(f"{n} share" for n in names),
    ):
        table.add_column(column, justify="left" if column == "routing" else "right")
    for i, name in enumerate(names):
        alone = [f"{100.0 if j == i else 0.0:.1f}%" for j in range(len(names))]
        table.add_row(
            f"{name} alone ({models[i]})",
            "",
            f"{test.quality[:, i].mean():.3f}",
            "",
            f"{1000 * test.cost[:, i].mean():.4f}",
            *alone,
        )
    for mode, point in modes.items():
        shares = [f"{100 * point['test']['share'][n]:.1f}%" for n in names]
        table.add_row(
            f"by value, {mode}",
            f"{point['tolerance']:.4f}",
            f"{point['test']['quality']:.3f}",
            f"{random_at(test, point['test']['cost_usd_per_1k']):.3f}",
            f"{point['test']['cost_usd_per_1k']:.4f}",
            *shares,
        )
    return table


def _summary_lines(test, names: list[str], modes: dict[str, dict[str, Any]]) -> list[str]:
    """Each mode's quality and cost on the test split, as shares of the best tier's alone."""
    best = test.best_tier()
    return [
        f"{mode}: {point['test']['quality'] / test.quality[:, best].mean():.1%} of {names[best]}'s quality "
        f"at {point['test']['cost_usd_per_1k'] / (1000 * test.cost[:, best].mean()):.1%} of its cost"
        for mode, point in modes.items()
    ]


def _write_plot(png: Path, title: str, test, predicted, names: list[str], modes: dict[str, dict[str, Any]]) -> Path:
    """Quality against cost on the test split as the tolerance grows, the modes marked (its folder made)."""
    from switchyard.evals import tiers as by_value

    png.parent.mkdir(parents=True, exist_ok=True)
    marks = {mode: {"tolerance": p["tolerance"], **p["test"]} for mode, p in modes.items()}
    by_value.write_plot(png, title, test, by_value.sweep(test, predicted, test.cost), names, marks)
    return png


def _write_section(
    path: Path, quality_models: dict[str, str], artifact: Path, data: dict[str, Any], modes: dict[str, dict[str, Any]]
) -> None:
    """`routing.by_value`: the balanced mode's tolerance, the other modes beside it."""
    from switchyard.core.thresholds import ThresholdsError, write_by_value

    section = {
        "quality_models": quality_models,
        "tolerance": modes["balanced"]["tolerance"],
        "target": modes["balanced"]["target"],
        "artifact": str(artifact),
        "data": data,
        "tuning": modes["balanced"]["tuning"],
        "test": modes["balanced"]["test"],
        "modes": {mode: modes[mode] for mode in ("economy", "max")},
    }
    try:
        write_by_value(path, section)
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc


def _predict(console, classifier, data, models: list[str], name: str):
    """Each tier model's predicted quality on each prompt of `data`, with a progress bar."""
    import numpy as np

    prompts = [t.prompt for t in data.traces]
    rows = []
    with progress_bar(console) as progress:
        task = progress.add_task(f"predicting quality ({name})", total=len(prompts))
        for start in range(0, len(prompts), 256):
            batch = prompts[start : start + 256]
            rows.append(classifier.score_with_quality(batch, models)[:, 1:])
            progress.advance(task, len(batch))
    return np.vstack(rows)
