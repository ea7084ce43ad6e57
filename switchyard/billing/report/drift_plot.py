"""The Drift section's figure: each day's PSI against the reference, and the period's bins beside
the reference's for the signal that moved most (the numbers: `billing/report/drift.py`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import date

import numpy as np
from matplotlib.ticker import PercentFormatter

from switchyard.billing.report.plots import PALETTE, Plot, _day_axis, _drawn, _style
from switchyard.billing.report.svg import DRAW_LOCK, Marks, new_figure, plain
from switchyard.billing.report.tables import Table


def drift(tables: Mapping[str, Table]) -> Plot:
    totals, by_day, bins = tables["drift"], tables["drift_by_day"], tables["drift_bins"]
    plot = Plot(
        "fig-drift",
        "Drift against the loaded version's reference",
        "Left: each day's population stability index (PSI) of the classifier's scores (auto) and of each judged "
        "rung's confidences against the reference in the thresholds file; the dashed line is drift.psi_alert, "
        "above which the traffic no longer looks like the data the thresholds were tuned on. Right: the period's "
        "share of values in each reference bin beside the reference's, for the signal with the largest PSI. "
        "When a line passes the bound, compare the observed rate with the predicted one in the table and re-tune "
        "(switchyard eval retune).",
        (totals.name, by_day.name, bins.name),
        empty_note="Nothing to compare: the thresholds file has no reference block (switchyard eval thresholds "
        "and eval cascade write one), or no auto or judged cascade request is in this period.",
    )
    if not totals.rows:
        return plot
    with DRAW_LOCK:
        return _draw(plot, totals, by_day, bins)


def _draw(plot: Plot, totals: Table, by_day: Table, bins: Table) -> Plot:
    figure, marks = new_figure(height_in=3.4), Marks()
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    series: dict[str, dict[date, float]] = defaultdict(dict)
    for row in by_day.records():
        if row["psi"] is not None:
            series[f"{row['signal']} {row['model']}"][row["day"]] = row["psi"]
    days = sorted({row["day"] for row in by_day.records()})
    bound = float(totals.records()[0]["psi_alert"])
    for i, (name, values) in enumerate(sorted(series.items())):
        points = [np.nan if d not in values else values[d] for d in days]
        marks(left.plot(days, points, color=PALETTE[i % len(PALETTE)], marker="o", markersize=4, label=plain(name)))
    line = left.axhline(bound, color="#e15759", linestyle="--", linewidth=1.4)
    line.set_label(plain(f"psi_alert {bound:g}"))
    marks(line)
    _style(left)
    _day_axis(left, days)
    left.set_ylabel("PSI")
    left.set_ylim(bottom=0)
    left.legend(frameon=False, fontsize=7, loc="upper left")
    scored = [r for r in totals.records() if r["psi"] is not None] or totals.records()
    worst = max(scored, key=lambda r: r["psi"] or 0.0)
    rows = [r for r in bins.records() if (r["signal"], r["model"]) == (worst["signal"], worst["model"])]
    index = np.arange(len(rows))
    reference = [r["reference_share"] for r in rows]
    observed = [np.nan if r["observed_share"] is None else r["observed_share"] for r in rows]
    marks(right.bar(index - 0.2, reference, width=0.4, color=PALETTE[0], label="reference"))
    marks(right.bar(index + 0.2, observed, width=0.4, color=PALETTE[1], label="this period"))
    right.set_xticks(index, [_bin_label(r["bin_low"], r["bin_high"]) for r in rows], rotation=45, fontsize=6)
    right.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    _style(right)
    right.set_title(plain(f"{worst['signal']} {worst['model']}: share per bin"), fontsize=9)
    right.legend(frameon=False, fontsize=7, loc="upper right")
    figure.suptitle(plot.title, x=0.01, ha="left", fontsize=11)
    return _drawn(plot, figure)


def _bin_label(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "all"
    if low is None:
        return f"<{high:.3g}"
    if high is None:
        return f">={low:.3g}"
    return f"{low:.3g}"
