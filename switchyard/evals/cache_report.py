"""The tables and the PNG plot of `switchyard eval cache`."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from switchyard.evals.cache_eval import OperatingPoint, PairScores, by_kind, sweep


def _share(value: float) -> str:
    return "—" if math.isnan(value) else f"{value * 100:.1f}%"


def kinds_table(title: str, scores: PairScores, threshold: float, part: str | None) -> Table:
    """Per kind of pair: how many, and the share the cache would serve with the guard and by cosine alone."""
    table = Table(title=title, title_justify="left")
    for header in ("label", "kind", "pairs", "served (guard)", "served (cosine only)"):
        table.add_column(header, justify="left" if header in ("label", "kind") else "right")
    for label, kind, count, guarded, alone in by_kind(scores, threshold, part):
        table.add_row(label, kind, str(count), _share(guarded), _share(alone))
    return table


def point_line(name: str, point: OperatingPoint | None) -> str:
    if point is None:
        return f"{name}: no threshold qualifies"
    return (
        f"{name}: similarity ≥ {point.threshold:.3f}: hit rate {_share(point.hit_rate)} on 'same' pairs, "
        f"false hits {_share(point.false_hit_rate)} of 'different' pairs"
    )


def write_plot(path: Path, title: str, scores: PairScores, part: str | None, chosen: OperatingPoint | None) -> None:
    """Hit rate on "same" pairs against false-hit rate on "different" pairs as the threshold moves,
    with the guard and by cosine alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 5))
    for guarded, label in ((True, "cosine + guard"), (False, "cosine only")):
        points = sweep(scores, guarded, part)
        axis.plot([p.false_hit_rate * 100 for p in points], [p.hit_rate * 100 for p in points], marker=".", label=label)
    if chosen is not None:
        axis.plot(
            [chosen.false_hit_rate * 100],
            [chosen.hit_rate * 100],
            "o",
            color="crimson",
            label=f"default (similarity {chosen.threshold:.3f})",
        )
    axis.set_xscale("symlog", linthresh=1)
    axis.set_xlabel("false hits (% of 'different' pairs served)")
    axis.set_ylabel("hit rate (% of 'same' pairs served)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
