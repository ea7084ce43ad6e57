"""`switchyard eval retune`: refit `auto`'s classifier head and thresholds and the cascade's scorer
and threshold on the company's own labelled rows; write a thresholds file only when the held-out
rows say it is better.

Exit status: 0 when it wrote `--out`; 1 when nothing was better beyond noise (nothing written);
2 on bad input (no rows, malformed rows, a bad option)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from switchyard.core.settings import Settings
from switchyard.evals.classifier_evaluate import QUALITY_TARGETS
from switchyard.evals.cli_support import cli_error

NOT_BETTER_EXIT = 1


def retune(
    out: Annotated[Path, typer.Option(help="Thresholds file to write when the re-tuned setting is better.")],
    config: Annotated[
        Path | None,
        typer.Option(
            help="The proxy's config: its ledger, thresholds file, classifier and cascade (default: built-in)."
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Rows created since: a duration (7d, 36h) or a UTC date (default: 7d from the ledger, "
            "every row of --traces)."
        ),
    ] = None,
    traces: Annotated[
        Path | None,
        typer.Option("--traces", "-t", help="Labelled rows as a trace file (.jsonl[.gz]) instead of the ledger's."),
    ] = None,
    holdout: Annotated[float, typer.Option(min=0.05, max=0.95, help="The newest share of rows held out.")] = 0.3,
    target_quality: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Fraction of the strong model's quality to reach (default: the current balanced mode's, else 0.95).",
        ),
    ] = None,
    weak: Annotated[str | None, typer.Option(help="The cheap model (default: the cheaper of the rows' two).")] = None,
    strong: Annotated[str | None, typer.Option(help="The strong model (default: the dearer of the rows' two).")] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG of held-out quality against cost, before and after.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap resamples.")] = 0,
) -> None:
    """Re-tune auto's classifier and thresholds and the cascade on your own labelled traffic."""
    from switchyard.backends.defaults import load_settings
    from switchyard.core.settings import ConfigError
    from switchyard.core.traces import TraceFormatError
    from switchyard.evals import retune_report
    from switchyard.evals.evaluate import EvalError
    from switchyard.evals.retune import retune as run_retune
    from switchyard.evals.retune_rows import (
        DEFAULT_LEDGER_WINDOW,
        paired_rows,
        parse_since,
        read_ledger_rows,
        read_trace_rows,
        resolve_pair,
        split_by_time,
    )

    try:
        settings = load_settings(config)
        if traces is not None:
            since_s = parse_since(since) if since is not None else None
            rows, source = read_trace_rows(traces), str(traces)
        else:
            since_s = parse_since(since or DEFAULT_LEDGER_WINDOW)
            url = settings.billing.resolved_database_url()
            rows, source = read_ledger_rows(url, since_s), "the ledger"
        weak, strong = resolve_pair(rows, weak, strong)
        timed = split_by_time(paired_rows(rows, weak, strong, since_s), holdout)
        routing, cascade, skipped, target = _current(settings, weak, target_quality)
        result = run_retune(
            timed, weak, strong, routing=routing, cascade=cascade, target_quality=target, seed=seed, skipped=skipped
        )
    except (ConfigError, TraceFormatError, EvalError) as exc:
        raise cli_error(str(exc)) from exc
    for line in retune_report.summary_lines(timed, weak, strong, result):
        typer.echo(line)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        retune_report.write_plot(plot, f"Re-tuning on {source}: {weak} → {strong}", result)
        typer.echo(f"wrote {plot}")
    better = [
        name
        for name, part in (("routing", result.routing), ("cascade", result.cascade))
        if part is not None and part.comparison.is_better
    ]
    if not better:
        typer.echo(f"nothing is better on the held-out rows beyond noise: {out} not written")
        raise typer.Exit(NOT_BETTER_EXIT)
    record = retune_report.provenance(timed, weak, strong, result, source=source, since=since_s, seed=seed)
    artifact = _write(out, settings, result, record, weak)
    typer.echo(f"wrote {out} ({', '.join(better)})" + (f" and the classifier in {artifact}" if artifact else ""))
    typer.echo(f"serve it: routing.thresholds_file: {out}")
    if artifact is not None:
        typer.echo(f"          routing.auto.classifier_artifact: {artifact}")


def _current(settings: Settings, weak: str, target_quality: float | None):
    """What the config serves now: the routing and cascade to compare against (None, with the
    reason in `skipped`, for a part it does not have), and the target quality fraction."""
    from switchyard.cascade.build import rung_specs
    from switchyard.classifier.model import default_artifact
    from switchyard.core.thresholds import read_thresholds
    from switchyard.evals.retune import CurrentCascade, CurrentRouting
    from switchyard.gateway.auto_router import resolve_thresholds

    path = settings.routing.thresholds_file
    file = read_thresholds(path) if path is not None else None
    auto, skipped = settings.routing.auto, {}
    targets = {mode: {"quality_fraction": fraction} for mode, fraction in QUALITY_TARGETS.items()}
    routing = None
    if file is not None and file.routing is not None:
        for mode, section in (("balanced", file.routing), *file.routing.modes.items()):
            target = getattr(section, "target", None)
            if (
                isinstance(target, dict)
                and len(target) == 1
                and set(target) <= {"quality_fraction", "max_strong_share"}
            ):
                targets[mode] = {key: float(value) for key, value in target.items()}
    if target_quality is not None:
        targets["balanced"] = {"quality_fraction": target_quality}
    fraction = targets["balanced"].get("quality_fraction", 0.95)
    if len(auto.tiers) != 2:
        skipped["routing"] = f"re-tuning fits `auto` between two tiers; the config has {len(auto.tiers)}"
    elif auto.quality_models is not None or (file and file.routing and file.routing.by_value):
        skipped["routing"] = "`auto` routes by value (routing.by_value), which re-tuning does not fit"
    else:
        modes = resolve_thresholds(auto.tiers, auto.thresholds, file)
        artifact = auto.classifier_artifact or default_artifact(by_value=False)
        current = {mode: values[0] for mode, values in modes.items()}
        routing = CurrentRouting(
            Path(artifact), current, {mode: targets.get(mode, targets["balanced"]) for mode in current}
        )
    cascade = None
    specs = {spec.model: spec for spec in rung_specs(settings.cascade, file)}
    if weak not in settings.cascade.ladder[:-1]:
        skipped["cascade"] = f"{weak} is not a rung that escalates in cascade.ladder ({settings.cascade.ladder})"
    else:
        spec = specs[weak]
        cascade = CurrentCascade(spec.scorer, spec.threshold, settings.cascade.first_k)
    return routing, cascade, skipped, fraction


def _write(out: Path, settings: Settings, result, record: dict, weak: str) -> Path | None:
    """The current thresholds file with each better part replaced and the provenance added; the
    re-tuned classifier beside it when routing changed. Returns the classifier's folder, if written."""
    from switchyard.core.thresholds import ThresholdsError, write_section
    from switchyard.evals.cascade_cli import write_rung

    current = settings.routing.thresholds_file
    out.parent.mkdir(parents=True, exist_ok=True)
    if current is not None and Path(current).resolve() != out.resolve():
        shutil.copyfile(current, out)
    elif current is None and out.exists():
        out.unlink()
    artifact = None
    try:
        routing = result.routing
        if routing is not None and routing.comparison.is_better:
            if routing.classifier is not None:
                artifact = out.parent / f"{out.stem}-classifier"
                routing.classifier.save(artifact)
            balanced = routing.thresholds["balanced"]
            write_section(
                out,
                "routing",
                {
                    "router": "classifier",
                    "threshold": balanced,
                    "weak_model": record["weak_model"],
                    "strong_model": record["strong_model"],
                    "target": routing.targets["balanced"],
                    "data": {
                        "source": record["source"],
                        "num_train": routing.num_fit,
                        "num_test": routing.num_held_out,
                    },
                    "train": routing.train["balanced"],
                    "test": routing.test["balanced"],
                    "modes": {
                        mode: {
                            "threshold": value,
                            "target": routing.targets[mode],
                            "train": routing.train[mode],
                            "test": routing.test[mode],
                        }
                        for mode, value in routing.thresholds.items()
                        if mode != "balanced"
                    },
                    "reference": routing.reference,
                },
                keep=("by_value",),
            )
        cascade = result.cascade
        if cascade is not None and cascade.comparison.is_better:
            report = cascade.report.to_json()
            write_rung(
                out,
                weak,
                {
                    "strong_model": report["strong_model"],
                    "scorer": report["scorer"],
                    "threshold": report["threshold"],
                    "target": report["target"],
                    "data": {
                        "source": record["source"],
                        "num_train": report["train"]["num_prompts"],
                        "num_test": report["test"]["num_prompts"],
                    },
                    "train": report["train"],
                    "test": report["test"],
                    "reference": cascade.reference,
                },
            )
        write_section(out, "provenance", record)
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    return artifact
