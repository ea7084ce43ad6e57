"""What `switchyard eval retune` prints, plots and records as provenance."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from switchyard.evals.retune import Comparison, RetuneResult
from switchyard.evals.retune_rows import TimedRows


def _when(created_at: float) -> str:
    return dt.datetime.fromtimestamp(created_at, dt.UTC).strftime("%Y-%m-%d %H:%M")


def window(timed: TimedRows) -> dict[str, Any]:
    def span(rows) -> list[str]:
        return [_when(rows[0].extra["created_at"]), _when(rows[-1].extra["created_at"])]

    return {"fit": span(timed.fit), "held_out": span(timed.held_out)}


def summary_lines(timed: TimedRows, weak: str, strong: str, result: RetuneResult) -> list[str]:
    spans = window(timed)
    lines = [
        f"{len(timed.rows)} rows graded for both {weak} and {strong}: fit on the older {len(timed.fit)} "
        f"({spans['fit'][0]} .. {spans['fit'][1]} UTC), report on the newer {len(timed.held_out)} "
        f"({spans['held_out'][0]} .. {spans['held_out'][1]} UTC)"
    ]
    if result.routing is not None:
        r = result.routing
        head = (
            "the shipped head (nothing learnable beyond it)" if r.classifier is None else f"re-tuned (L2 {r.fit.l2:g})"
        )
        lines += [
            "",
            f"routing ({r.num_fit} rows fit, {r.num_held_out} held out; classifier: {head})",
            f"  {'':8}{'strong calls':>13}{'quality':>9}{'$ / 1k':>10}{'APGR':>8}{'$ / 1k at target':>18}",
        ]
        for name, point in (("before", r.before), ("after", r.after)):
            lines.append(
                f"  {name:8}{point['strong_share'] * 100:12.1f}%{point['quality']:9.3f}"
                f"{point['cost_usd_per_1k']:10.4f}{point['apgr']:8.3f}{point['cost_at_target_usd_per_1k']:18.4f}"
            )
        lines.append(_verdict(r.comparison))
    if result.cascade is not None:
        c = result.cascade
        lines += [
            "",
            f"cascade ({c.report.train['num_prompts']} rows fit, {c.report.test['num_prompts']} held out; "
            f"scorer {c.report.scorer.name}, threshold {c.report.threshold:.4g})",
            f"  {'':8}{'escalated':>10}{'quality':>9}{'$ / 1k':>10}{'AUROC':>8}{'$ / 1k at target':>18}",
        ]
        points: tuple[tuple[str, Mapping[str, Any], float], ...] = (
            ("before", c.before, c.comparison.before),
            ("after", c.report.test, c.comparison.after),
        )
        for name, rung, at_target in points:
            auroc = rung["auroc"]
            lines.append(
                f"  {name:8}{rung['escalation_rate'] * 100:9.1f}%{rung['quality']:9.3f}"
                f"{rung['cost_usd'] * 1000:10.4f}{'-' if auroc is None else f'{auroc:.3f}':>8}{at_target:18.4f}"
            )
        lines.append(_verdict(c.comparison))
    for part, why in result.skipped.items():
        lines += ["", f"{part}: not re-tuned: {why}"]
    return lines


def _verdict(comparison: Comparison) -> str:
    low, high = comparison.ci95
    verdict = "better" if comparison.is_better else "not better beyond noise"
    return (
        f"  at {comparison.target_quality:.0%} of the strong model's quality: saves "
        f"${comparison.before - comparison.after:.4f} / 1k prompts (95% interval {low:.4f} .. {high:.4f}): {verdict}"
    )


def provenance(
    timed: TimedRows, weak: str, strong: str, result: RetuneResult, *, source: str, since: float | None, seed: int
) -> dict[str, Any]:
    """The thresholds file's `provenance` section: the rows, their window, before and after."""
    out: dict[str, Any] = {
        "command": "switchyard eval retune",
        "source": source,
        "since": _when(since) if since is not None else None,
        "weak_model": weak,
        "strong_model": strong,
        "rows": {"total": len(timed.rows), "fit": len(timed.fit), "held_out": len(timed.held_out)},
        "window": window(timed),
        "seed": seed,
    }
    if result.routing is not None:
        r = result.routing
        out["routing"] = {
            "written": r.comparison.is_better,
            "classifier": "shipped" if r.classifier is None else f"residual, L2 {r.fit.l2:g}",
            "inner_log_loss": {k: round(v, 6) for k, v in r.fit.inner_log_loss.items()},
            "before": r.before,
            "after": r.after,
            "comparison": _comparison(r.comparison),
        }
    if result.cascade is not None:
        c = result.cascade
        out["cascade"] = {
            "written": c.comparison.is_better,
            "before": c.before,
            "after": dict(c.report.test),
            "comparison": _comparison(c.comparison),
        }
    if result.skipped:
        out["skipped"] = dict(result.skipped)
    return out


def _comparison(comparison: Comparison) -> dict[str, Any]:
    return {
        "statistic": "USD per 1k prompts at the target quality, before minus after (held-out rows)",
        "target_quality_fraction": comparison.target_quality,
        "before": comparison.before,
        "after": comparison.after,
        "ci95": list(comparison.ci95),
    }


def write_plot(path: Path, title: str, result: RetuneResult) -> None:
    """Held-out quality against cost, before and after, one panel per part re-tuned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [
        (name, part.curves, part.comparison)
        for name, part in (("routing", result.routing), ("cascade", result.cascade))
        if part is not None
    ]
    fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 5), squeeze=False)
    for axis, (name, curves, comparison) in zip(axes[0], parts, strict=True):
        for label, curve, style in (("before", curves[0], "--"), ("after", curves[1], "-")):
            axis.plot(curve.cost_usd * 1000, curve.quality, style, label=label)
        target = comparison.target_quality * float(curves[0].quality[-1])
        axis.axhline(target, color="grey", linewidth=0.8, linestyle=":", label="target quality")
        axis.set_xlabel("cost (USD per 1k prompts)")
        axis.set_ylabel("quality (held-out rows)")
        axis.set_title(name)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
