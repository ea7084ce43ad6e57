"""The report's figures, drawn with matplotlib from its tables: one function per figure.

Each returns a `Plot`: the inline SVG (None when the period has nothing to show for it, with a
note saying so), a title, a one-line explanation for an analyst, and the tables shown beneath.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import matplotlib.dates as mdates
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter, ScalarFormatter

from switchyard.billing.report.svg import DRAW_LOCK, Marks, new_figure, plain, to_svg
from switchyard.billing.report.tables import Table

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
OTHER_COLOR = "#bab0ac"
OUTCOME_STYLE = {
    "as_routed": ("as routed", "#4e79a7"),
    "fallback": ("fell back", "#f28e2b"),
    "degraded": ("degraded", "#b07aa1"),
    "failed": ("failed", "#e15759"),
}
MAX_SERIES = 8  # more teams or models than this are summed as "other" in the plot (not in the tables)
FEW_DAYS = 7  # a period this short gets a tick and a label for each of its days


@dataclass(frozen=True, slots=True)
class Plot:
    id: str
    title: str
    explanation: str
    tables: tuple[str, ...]
    svg: str | None = None
    empty_note: str = ""


def _style(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8)


class UsdFormatter(ScalarFormatter):
    """Matplotlib's tick labels (as many decimals as the tick spacing needs), with a dollar sign."""

    def __init__(self) -> None:
        super().__init__(useOffset=False)
        self.set_powerlimits((-7, 9))  # plain decimals: an exponent apart from a "$" reads wrong

    def __call__(self, x: float, pos: int | None = None) -> str:
        text = super().__call__(x, pos).replace("\N{MINUS SIGN}", "-")
        return ("-$" + text[1:] if text.startswith("-") else "$" + text) if text else text


def _usd_axis(ax: Axes, axis: str = "y") -> None:
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(UsdFormatter())


def usd_text(value: float) -> str:
    return f"${value:,.2f}" if abs(value) >= 0.05 else f"${value:.4f}"


def _day_axis(ax: Axes, days: list[date]) -> None:
    num_days = (days[-1] - days[0]).days + 1
    if num_days <= FEW_DAYS:
        # a tick a day, each labelled, and no empty day around them (a lone day is not a 3-day axis)
        day_locator = mdates.DayLocator()
        ax.xaxis.set_major_locator(day_locator)
        ax.xaxis.set_major_formatter(
            mdates.DateFormatter("%Y-%m-%d") if num_days == 1 else mdates.ConciseDateFormatter(day_locator)
        )
        ax.set_xlim(mdates.date2num(days[0]) - 0.6, mdates.date2num(days[-1]) + 0.6)
        ax.set_xlabel("day (UTC)")
        return
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    # matplotlib's stubs take no dates; its date converter does
    ax.set_xlim(days[0] - timedelta(days=1), days[-1] + timedelta(days=1))  # type: ignore[arg-type]
    ax.set_xlabel("day (UTC)")


def _legend(ax: Axes) -> None:
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _top_series(table: Table, key: str, value: str) -> dict[str, dict[date, float]]:
    """{series: {day: value}}, the largest MAX_SERIES by total, the rest summed as "other"."""
    totals: dict[str, float] = defaultdict(float)
    for row in table.records():
        totals[row[key]] += row[value]
    keep = sorted(totals, key=lambda k: (-totals[k], k))[:MAX_SERIES]
    series: dict[str, dict[date, float]] = {k: defaultdict(float) for k in keep}
    for row in table.records():
        name = row[key] if row[key] in series else "other"
        series.setdefault(name, defaultdict(float))[row["day"]] += row[value]
    return series


def _stacked_days(ax: Axes, series: dict[str, dict[date, float]], marks: Marks) -> list[date]:
    days = sorted({d for values in series.values() for d in values})
    x = np.array(days, dtype="datetime64[D]")
    bottom = np.zeros(len(days))
    for i, (name, values) in enumerate(series.items()):
        heights = np.array([values.get(d, 0.0) for d in days])
        color = OTHER_COLOR if name == "other" else PALETTE[i % len(PALETTE)]
        shown = heights > 0  # a segment of zero height would be an invisible mark
        bars = ax.bar(x[shown], heights[shown], bottom=bottom[shown], width=0.8, label=plain(name), color=color)
        marks(bars)
        bottom += heights
    return days


def _cost_by_day(
    table: Table, key: str, *, id: str, title: str, explanation: str, more_tables: tuple[str, ...] = ()
) -> Plot:
    note = "No cost in this period: every attempt was free."
    plot = Plot(id, title, explanation, (table.name, *more_tables), empty_note=note)
    if not any(row["cost_usd"] for row in table.records()):
        return plot
    figure, marks = new_figure(), Marks()
    ax = figure.add_subplot()
    days = _stacked_days(ax, _top_series(table, key, "cost_usd"), marks)
    _style(ax)
    _day_axis(ax, days)
    ax.set_ylabel("cost (USD)")
    _usd_axis(ax)
    ax.set_title(title, loc="left", fontsize=11)
    _legend(ax)
    return _drawn(plot, figure)


def cost_by_team(tables: Mapping[str, Table]) -> Plot:
    return _cost_by_day(
        tables["cost_by_team_day"],
        "team",
        id="fig-cost-by-team",
        title="Cost per day by team",
        explanation="What each team spent each UTC day, every attempt included (escalations, retries and "
        "failures that cost tokens); the largest teams are shown, the rest are summed as “other”. "
        "Below it, the period's cost per API key.",
        more_tables=("cost_by_key",),
    )


def cost_by_model(tables: Mapping[str, Table]) -> Plot:
    return _cost_by_day(
        tables["cost_by_model_day"],
        "model",
        id="fig-cost-by-model",
        title="Cost per day by model",
        explanation="Where the money went: the cost of every attempt per model and UTC day.",
    )


def cost_by_kind(tables: Mapping[str, Table]) -> Plot:
    table = tables["cost_by_kind_day"]
    if not any(row["kind"] == "batch" for row in table.records()):
        return Plot(
            "fig-cost-by-kind",
            "Batch and interactive cost per day",
            "",
            (table.name,),
            empty_note="No batch requests in this period: every request was interactive.",
        )
    return _cost_by_day(
        table,
        "kind",
        id="fig-cost-by-kind",
        title="Batch and interactive cost per day",
        explanation="What the batch tier's lines cost (at the batch price factor) beside every other request, "
        "per UTC day.",
    )


def route_mix(tables: Mapping[str, Table]) -> Plot:
    table = tables["route_mix"]
    plot = Plot(
        "fig-route-mix",
        "Route mix",
        "How client requests were served: auto by the tier it chose, the cascade accepted at its first rung or "
        "escalated, or a model named directly; each bar is split by outcome (answered as routed, fell back to "
        "another model, degraded under load, or failed).",
        (table.name,),
        empty_note="No requests in this period.",
    )
    if not table.rows:
        return plot
    rows = table.records()[::-1]  # first row on top
    figure, marks = new_figure(height_in=max(2.4, 0.45 * len(rows) + 1.4)), Marks()
    ax = figure.add_subplot()
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    for outcome, (name, color) in OUTCOME_STYLE.items():
        widths = np.array([r[outcome] for r in rows], dtype=float)
        shown = widths > 0
        if shown.any():
            marks(ax.barh(y[shown], widths[shown], left=left[shown], height=0.6, label=name, color=color))
        left += widths
    ax.set_yticks(y, [plain(r["route"]) for r in rows])
    _style(ax)
    ax.grid(axis="y", visible=False)
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.8)
    ax.set_xlabel("requests")
    ax.set_ylabel("route")
    ax.set_title(plot.title, loc="left", fontsize=11)
    _legend(ax)
    return _drawn(plot, figure)


def escalation(tables: Mapping[str, Table]) -> Plot:
    by_day, reasons = tables["escalation_by_day"], tables["escalation_reasons"]
    plot = Plot(
        "fig-escalation",
        "Escalations per day, by reason",
        "A request escalated when a rung other than its first answered it. Bars: escalated requests (auto and "
        "cascade), by why they left their first rung (left axis). Lines: each entry point's escalation rate, its "
        "escalated requests over all its requests (right axis).",
        (by_day.name, reasons.name),
        empty_note="No auto or cascade requests in this period.",
    )
    if not by_day.rows:
        return plot
    figure, marks = new_figure(), Marks()
    ax = figure.add_subplot()
    series = _top_series(reasons, "reason", "escalated_requests") if reasons.rows else {}
    days = sorted({r["day"] for r in by_day.records()})
    if series:
        _stacked_days(ax, series, marks)
    rates = ax.twinx()
    for entry, color in (("cascade", "#333333"), ("auto", "#9c755f")):
        by_entry = {r["day"]: r["escalation_rate"] for r in by_day.records() if r["entry"] == entry}
        if not by_entry:
            continue
        rate = [np.nan if by_entry.get(d) is None else by_entry[d] for d in days]
        label = f"{entry} escalation rate"
        marks(rates.plot(days, rate, color=color, marker="o", markersize=4, linewidth=1.6, label=label))
    rates.set_ylim(0, 1.05)
    rates.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    rates.set_ylabel("requests escalated")
    rates.spines[["top"]].set_visible(False)
    rates.tick_params(labelsize=8)
    _style(ax)
    _day_axis(ax, days)
    ax.set_ylabel("escalated requests")
    ax.set_title(plot.title, loc="left", fontsize=11)
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = rates.get_legend_handles_labels()
    ax.legend(
        handles + more_handles, labels + more_labels, frameon=False, fontsize=8, loc="upper left",
        bbox_to_anchor=(1.08, 1.0),
    )  # fmt: skip
    return _drawn(plot, figure)


def savings(tables: Mapping[str, Table]) -> Plot:
    table = tables["savings_by_day"]
    plot = Plot(
        "fig-savings",
        "Routed requests: realised cost against the strongest model",
        "Cumulative cost of the requests sent to auto or cascade, against what the same answers would have cost "
        "on the strongest model each route could reach; the green gap is what routing saved (red: where escalations "
        "and retries cost more than the strongest model would have).",
        (table.name,),
        empty_note="No routed (auto or cascade) requests with a cost in this period.",
    )
    if not any(row["realised_cost_usd"] or row["ceiling_cost_usd"] for row in table.records()):
        return plot
    realised: dict[date, float] = defaultdict(float)
    ceiling: dict[date, float] = defaultdict(float)
    for row in table.records():
        realised[row["day"]] += row["realised_cost_usd"]
        ceiling[row["day"]] += row["ceiling_cost_usd"]
    days = sorted(realised)
    spent = np.cumsum([realised[d] for d in days])
    strongest = np.cumsum([ceiling[d] for d in days])
    if len(days) == 1:
        return _savings_of_one_day(plot, days[0], float(spent[0]), float(strongest[0]))
    figure, marks = new_figure(), Marks()
    ax = figure.add_subplot()
    # matplotlib's stubs take no dates for x (the `days` lines); its date converter does
    marks(
        ax.plot(
            days,  # type: ignore[arg-type]
            strongest, color="#e15759", marker="o", markersize=4, label="all on the strongest model",
        )
    )  # fmt: skip
    marks(
        ax.plot(
            days,  # type: ignore[arg-type]
            spent, color="#4e79a7", marker="o", markersize=4, label="realised (routed)",
        )
    )  # fmt: skip
    for where, color, label in ((strongest > spent, "#59a14f", "saved"), (spent > strongest, "#e15759", "overspent")):
        if where.any():
            marks(
                ax.fill_between(
                    days,  # type: ignore[arg-type]
                    spent, strongest, where=where, interpolate=True, color=color, alpha=0.2, label=label,
                )
            )  # fmt: skip
    _style(ax)
    _day_axis(ax, days)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("cumulative cost (USD)")
    _usd_axis(ax)
    ax.set_title(plot.title, loc="left", fontsize=11)
    _legend(ax)
    return _drawn(plot, figure)


def _savings_of_one_day(plot: Plot, day: date, spent: float, strongest: float) -> Plot:
    """One day has no curve to draw: two bars side by side, each with its amount, and the gap named."""
    figure, marks = new_figure(), Marks()
    ax = figure.add_subplot()
    center = np.datetime64(day, "m")
    offset = np.timedelta64(288, "m")  # a fifth of a day either side
    for x, value, color, label in (
        (center - offset, strongest, "#e15759", "all on the strongest model"),
        (center + offset, spent, "#4e79a7", "realised (routed)"),
    ):
        bars = ax.bar(np.array([x]), [value], width=0.36, color=color, label=label)
        ax.bar_label(bars, labels=[usd_text(value)], padding=3, fontsize=8)
        marks(bars)
    _style(ax)
    _day_axis(ax, [day])
    ax.set_ylim(bottom=0, top=max(spent, strongest) * 1.15 or None)
    ax.set_ylabel("cost (USD)")
    _usd_axis(ax)
    ax.set_title(plot.title, loc="left", fontsize=11)
    gap = strongest - spent
    verdict = f"routing saved {usd_text(gap)}" if gap >= 0 else f"routing cost {usd_text(-gap)} more"
    if strongest:
        verdict += f" ({100 * gap / strongest:.1f}%)"
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=verdict, title_fontsize=8)
    return _drawn(plot, figure)


def hosting(tables: Mapping[str, Table]) -> Plot:
    models, blended = tables["models"], tables["cost_by_hosting"]
    plot = Plot(
        "fig-hosting",
        "Cost per 1M tokens: self-hosted against commercial",
        "Realised USD per million tokens (prompt and completion together) for each model, coloured by where it "
        "runs; dashed lines are each hosting's blended rate over all its tokens.",
        (blended.name, models.name),
        empty_note="No tokens with a cost in this period.",
    )
    rows = [r for r in models.records() if r["usd_per_mtok"] is not None]
    if not any(r["usd_per_mtok"] for r in rows):
        return plot
    rows.sort(key=lambda r: (r["hosting"], -r["usd_per_mtok"], r["model"]), reverse=True)
    colors = {h: PALETTE[i % len(PALETTE)] for i, h in enumerate(sorted({r["hosting"] for r in rows}))}
    figure, marks = new_figure(height_in=max(2.4, 0.4 * len(rows) + 1.4)), Marks()
    ax = figure.add_subplot()
    shown: set[str] = set()
    for r in rows:
        label = None if r["hosting"] in shown else plain(r["hosting"])
        shown.add(r["hosting"])
        bars = ax.barh(plain(r["model"]), r["usd_per_mtok"], height=0.6, color=colors[r["hosting"]], label=label)
        ax.bar_label(bars, labels=[usd_text(r["usd_per_mtok"])], padding=3, fontsize=8)
        if r["usd_per_mtok"] > 0:
            marks(bars)
    for r in blended.records():
        if r["usd_per_mtok"] is not None and r["hosting"] in colors:
            line = ax.axvline(r["usd_per_mtok"], color=colors[r["hosting"]], linestyle="--", linewidth=1.2)
            line.set_label(plain(f"{r['hosting']} blended"))
            marks(line)
    _style(ax)
    ax.grid(axis="y", visible=False)
    ax.grid(axis="x", color="#e5e5e5", linewidth=0.8)
    ax.set_xlim(left=0)
    ax.set_xlabel("USD per 1M tokens")
    ax.set_ylabel("model")
    _usd_axis(ax, "x")
    ax.set_title(plot.title, loc="left", fontsize=11)
    _legend(ax)
    return _drawn(plot, figure)


def latency(tables: Mapping[str, Table]) -> Plot:
    table = tables["latency_by_model"]
    plot = Plot(
        "fig-latency",
        "Latency and time to first token per model",
        "Median (p50) and 95th percentile (p95) of the whole attempt's duration and, for streams, of the time to "
        "the first token, over completed attempts; a long p95 bar next to a short p50 means a slow tail.",
        (table.name,),
        empty_note="No completed attempts in this period.",
    )
    rows = table.records()[::-1]
    if not rows:
        return plot
    panels = [("p50_latency_ms", "p95_latency_ms", "duration")]
    if any(r["ttft_samples"] for r in rows):
        panels.append(("p50_ttft_ms", "p95_ttft_ms", "time to first token"))
    return _percentile_bars(plot, rows, panels, "model")


def latency_by_route(tables: Mapping[str, Table]) -> Plot:
    table = tables["latency_by_route"]
    plot = Plot(
        "fig-latency-route",
        "Latency as the client saw it, per route",
        "Median (p50) and 95th percentile (p95), from the proxy receiving each request: to the first byte of its "
        "answer (a stream's first chunk; a whole answer's only write), to its last byte, and what the route added "
        "beyond the answering attempt's own time (routing, the rungs judged and dropped, retries). Compare "
        "cascade:accepted and cascade:escalated with direct to see what the cascade adds.",
        (table.name,),
        empty_note="No request in this period recorded its client-seen times.",
    )
    rows = table.records()[::-1]
    if not rows:
        return plot
    panels = (
        ("p50_ttfb_ms", "p95_ttfb_ms", "time to first byte"),
        ("p50_duration_ms", "p95_duration_ms", "total time"),
        ("p50_added_ms", "p95_added_ms", "added by the route"),
    )
    return _percentile_bars(plot, rows, panels, "route")


def _percentile_bars(
    plot: Plot, rows: list[dict[str, Any]], panels: Sequence[tuple[str, str, str]], label: str
) -> Plot:
    """One panel per (p50 column, p95 column, what) of milliseconds: a p50 and a p95 bar per row,
    rows named by their `label` column; a missing value draws no bar."""
    figure, marks = new_figure(height_in=max(2.6, 0.5 * len(rows) + 1.4)), Marks()
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    y = np.arange(len(rows))
    for ax, (p50, p95, what) in zip(axes, panels, strict=True):
        for offset, column, name, color in ((0.2, p50, "p50", "#4e79a7"), (-0.2, p95, "p95", "#f28e2b")):
            shown = np.array([r[column] is not None for r in rows])
            values = np.array([r[column] for r in rows if r[column] is not None], dtype=float)
            if shown.any():
                marks(ax.barh(y[shown] + offset, values, height=0.38, color=color, label=name))
        _style(ax)
        ax.grid(axis="y", visible=False)
        ax.grid(axis="x", color="#e5e5e5", linewidth=0.8)
        ax.set_xlabel(f"{what} (ms)")
        ax.set_title(what, fontsize=9)
    axes[0].set_yticks(y, [plain(r[label]) for r in rows])
    axes[0].set_ylabel(label)
    figure.suptitle(plot.title, x=0.01, ha="left", fontsize=11)
    _legend(axes[-1])
    return _drawn(plot, figure)


MAX_CONFIDENCE_PANELS = 6  # judged models drawn (the tables hold them all)


def confidence(tables: Mapping[str, Table]) -> Plot:
    bins, judged = tables["confidence_histogram"], tables["confidence_by_model"]
    plot = Plot(
        "fig-confidence",
        "Cascade confidence against the threshold, per judged model",
        "How sure each judged rung was of its answers: a histogram of the confidence scores the cascade gave them, "
        "and a dashed line at the threshold an answer had to reach (below it, the next rung answered). Mass piled "
        "just under the line means a small move of the threshold would change many escalations.",
        (judged.name, bins.name),
        empty_note="The cascade judged no answer in this period (or none recorded its confidence).",
    )
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in bins.records():
        by_model[row["model"]].append(row)
    if not by_model:
        return plot
    models = sorted(by_model)[:MAX_CONFIDENCE_PANELS]
    num_columns = min(len(models), 3)
    num_rows = -(-len(models) // num_columns)
    figure, marks = new_figure(height_in=2.6 * num_rows + 0.6), Marks()
    axes = figure.subplots(num_rows, num_columns, squeeze=False).ravel()
    for ax, model in zip(axes, models, strict=False):
        rows = by_model[model]
        lows = np.array([r["bin_low"] for r in rows], dtype=float)
        widths = np.array([r["bin_high"] - r["bin_low"] for r in rows], dtype=float)
        counts = np.array([r["answers"] for r in rows], dtype=float)
        shown = counts > 0
        marks(ax.bar(lows[shown], counts[shown], width=widths[shown], align="edge", color=PALETTE[0], label="answers"))
        thresholds = sorted({r["threshold"] for r in judged.records() if r["model"] == model})
        for i, threshold in enumerate(thresholds):
            line = ax.axvline(threshold, color=PALETTE[3 + i % 3], linestyle="--", linewidth=1.4)
            line.set_label(plain(f"threshold {threshold:g}"))
            marks(line)
        _style(ax)
        ax.set_title(plain(model), fontsize=9)
        ax.set_xlabel("confidence")
        ax.set_ylabel("answers")
        ax.legend(frameon=False, fontsize=7, loc="upper left")
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    figure.suptitle(plot.title, x=0.01, ha="left", fontsize=11)
    return _drawn(plot, figure)


def _drawn(plot: Plot, figure: Figure) -> Plot:
    return Plot(plot.id, plot.title, plot.explanation, plot.tables, to_svg(figure, plot.id))


FIGURES: tuple[Callable[[Mapping[str, Table]], Plot], ...] = (
    cost_by_team,
    cost_by_model,
    cost_by_kind,
    route_mix,
    escalation,
    confidence,
    savings,
    hosting,
    latency,
    latency_by_route,
)


def draw_all(tables: Mapping[str, Table]) -> list[Plot]:
    with DRAW_LOCK:
        return [draw(tables) for draw in FIGURES]
