"""The report as one self-contained HTML page: inline CSS and SVG, no script, no external resource.

A header with the period and the team filter, the headline numbers, then one section per figure:
its plot, a line on how to read it, and its tables. An empty period is a page that says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from html import escape
from typing import Any

from switchyard.billing.report.plots import Plot
from switchyard.billing.report.tables import Cell, Table

FOOTER = "switchyard report --out DIR writes the same numbers as CSV files and summary.json."
MAX_TABLE_ROWS = 200  # beyond this the page shows the first rows and points at the CSV file
MAX_PIVOT_MODELS = 10  # the team × model table's columns: the costliest models, the rest summed as "other"

CSS = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --accent:#4e79a7; --bg:#f5f7fa; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color:var(--ink); background:var(--bg); }
header.top { background:#1f2933; color:#fff; padding:20px 32px 16px; }
header.top h1 { margin:0 0 4px; font-size:22px; font-weight:600; }
header.top p { margin:0; color:#cbd2d9; }
dl.filters { display:flex; flex-wrap:wrap; gap:8px 28px; margin:14px 0 0; }
dl.filters div { display:flex; gap:6px; align-items:baseline; }
dl.filters dt { color:#9aa5b1; font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
dl.filters dd { margin:0; font-weight:600; }
nav { padding:8px 32px; background:#fff; border-bottom:1px solid var(--line); font-size:13px; }
nav a { color:var(--accent); margin-right:16px; text-decoration:none; }
main { max-width:1180px; margin:0 auto; padding:20px 32px 40px; }
.kpis { display:grid; grid-template-columns:repeat(auto-fit, minmax(200px, 1fr)); gap:14px; margin-bottom:20px; }
.kpi { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 16px; }
.kpi .label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
.kpi .value { font-size:26px; font-weight:600; margin:4px 0 2px; font-variant-numeric:tabular-nums; }
.kpi .note { color:var(--muted); font-size:12px; }
section.panel { background:#fff; border:1px solid var(--line); border-radius:8px; padding:16px 20px;
                margin-bottom:20px; }
section.panel h2 { font-size:17px; margin:0 0 4px; }
p.explain { color:var(--muted); margin:0 0 10px; }
figure { margin:0; }
figure svg { display:block; width:100%; height:auto; }
p.empty { padding:18px; background:var(--bg); border-radius:6px; color:var(--muted); margin:8px 0; }
details { margin-top:10px; }
summary { cursor:pointer; color:var(--accent); font-size:13px; }
.scroll { overflow-x:auto; max-height:420px; overflow-y:auto; margin-top:6px; }
table { border-collapse:collapse; font-size:12.5px; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:4px 10px; border-bottom:1px solid var(--line); white-space:nowrap; }
th { position:sticky; top:0; background:#fafbfc; text-align:left; font-weight:600; }
td.num { text-align:right; }
.nousage { background:#fff; border:1px solid var(--line); border-radius:8px; padding:40px; text-align:center; }
.nousage h2 { margin:0 0 8px; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:0 0 24px; }
td.worse { color:#b42318; } td.better { color:#2f7d32; }
tr.total td { font-weight:600; }
"""


def usd(value: float | None) -> str:
    if value is None:
        return "—"
    size = abs(value)
    if size == 0:
        return "$0"
    sign = "-" if value < 0 else ""
    if size >= 1:
        return f"{sign}${size:,.2f}"
    return f"{sign}${size:.4f}" if size >= 0.01 else f"{sign}${size:.6f}"


def percent(value: float | None, scale: float = 100.0) -> str:
    return "—" if value is None else f"{value * scale:.1f}%"


def cell(column: str, value: Cell) -> tuple[str, bool]:
    """(text, is_number) for one table cell."""
    if value is None:
        return "—", True
    if isinstance(value, date):
        return value.isoformat(), False
    if isinstance(value, str):
        return value, False
    if column.endswith("_usd") or "usd_per_mtok" in column:
        return usd(value), True
    if column in ("share", "escalation_rate", "strong_share"):
        return percent(value), True
    if column == "judged_quality" and isinstance(value, float):
        return f"{value:.3f}", True
    if column.endswith("_pct"):
        return percent(value, 1.0), True
    if isinstance(value, float):
        return f"{value:,.1f}", True
    return f"{value:,}", True


def render_table(table: Table) -> str:
    shown = table.rows[:MAX_TABLE_ROWS]
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    body = []
    for row in shown:
        cells = [cell(c, v) for c, v in zip(table.columns, row, strict=True)]
        body.append("<tr>" + "".join(f"<td{' class=num' if n else ''}>{escape(t)}</td>" for t, n in cells) + "</tr>")
    more = f", first {MAX_TABLE_ROWS} shown" if len(table.rows) > MAX_TABLE_ROWS else ""
    is_open = " open" if len(table.rows) <= 12 else ""
    return (
        f"<details{is_open}><summary>Data: {escape(table.file_name)} ({len(table.rows)} rows{more})</summary>"
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
        "</details>"
    )


def render_plot(plot: Plot, tables: Mapping[str, Table]) -> str:
    section_id = plot.id.removeprefix("fig-")
    parts = [f'<section class="panel" id="{section_id}"><h2>{escape(plot.title)}</h2>']
    parts.append(f'<p class="explain">{escape(plot.explanation)}</p>')
    if plot.svg is None:
        parts.append(f'<p class="empty">{escape(plot.empty_note)}</p>')
    else:
        parts.append(f'<figure id="{plot.id}" aria-label="{escape(plot.title)}">{plot.svg}</figure>')
        parts.extend(render_table(tables[name]) for name in plot.tables)
    parts.append("</section>")
    return "\n".join(parts)


def render_refusals(table: Table) -> str:
    """The refused requests per team and key by reason (a panel; nothing when there were none)."""
    num_refused = sum(n for *_, n in table.rows if isinstance(n, int))
    if not num_refused:
        return ""
    return (
        '<section class="panel" id="refusals"><h2>Refusals</h2>'
        f'<p class="explain">{num_refused:,} requests answered with an error before any model was called, per '
        "team and key by reason (budget, rate_limit, else the error code sent). They are in no other figure "
        "or number: they used no tokens, cost nothing and have no latency.</p>" + render_table(table) + "</section>"
    )


def render_versions(table: Table) -> str:
    """The routing versions that routed auto and cascade requests, side by side (a panel; nothing
    when no request recorded one)."""
    if not table.rows:
        return ""
    return (
        '<section class="panel" id="routing-versions"><h2>Routing versions</h2>'
        '<p class="explain">Each version of the thresholds file and classifier artifact that routed auto and '
        "cascade requests (during a rollout: the current one and the candidate). Cost per request, the share of "
        "requests a rung above the first answered (escalation), the share answered at the strongest model's cost "
        "(strong share, priced answers only), and the judged quality of the answers where shadow labels or "
        "feedback exist.</p>" + render_table(table) + "</section>"
    )


def _kpi(label: str, value: str, note: str) -> str:
    return (
        f'<div class="kpi"><div class="label">{escape(label)}</div><div class="value">{escape(value)}</div>'
        f'<div class="note">{escape(note)}</div></div>'
    )


def render_kpis(summary: Mapping[str, Any]) -> str:
    saved, escalation, hosting = summary["savings"], summary["escalation"], summary["hosting"]
    tokens = summary["prompt_tokens"] + summary["completion_tokens"]
    self_hosted = hosting.get("self-hosted", {})
    commercial = hosting.get("commercial", {})
    cards = [
        _kpi("Total cost", usd(summary["cost_usd"]), f"{summary['attempts']:,} attempts · {tokens:,} tokens"),
        _kpi(
            "Requests",
            f"{summary['requests']:,}",
            f"{summary['savings']['routed_requests']:,} routed by auto or cascade",
        ),
        _kpi(
            "Saved by routing",
            usd(saved["savings_usd"]) if saved["routed_requests"] else "—",
            f"{percent(saved['savings_pct'], 1.0)} of {usd(saved['ceiling_cost_usd'])} on the strongest model, "
            f"{saved['routed_requests']:,} routed requests"
            if saved["routed_requests"]
            else "no auto or cascade requests",
        ),
        *(_escalation_kpi(entry, escalation[entry]) for entry in ("cascade", "auto")),
        _batch_kpi(summary),
        _cache_kpi(summary),
        _response_cache_kpi(summary),
        _kpi(
            "Self-hosted tokens",
            percent(self_hosted["tokens"] / tokens) if self_hosted and tokens else "—",
            f"{usd(self_hosted.get('usd_per_mtok'))} vs {usd(commercial.get('usd_per_mtok'))} commercial per 1M",
        ),
    ]
    return '<section class="kpis">' + "".join(cards) + "</section>"


def _escalation_kpi(entry: str, escalation: Mapping[str, Any]) -> str:
    """One entry point's escalation rate: its requests a rung other than their first answered."""
    if not escalation["requests"]:
        return _kpi(f"Escalation rate · {entry}", "—", f"no {entry} requests")
    return _kpi(
        f"Escalation rate · {entry}",
        percent(escalation["rate"]),
        f"{escalation['escalated_requests']:,} of {escalation['requests']:,} {entry} requests answered by a "
        "higher rung",
    )


def _cache_kpi(summary: Mapping[str, Any]) -> str:
    """Prompt tokens read from and written to a prompt cache, and what that saved (reads at the
    cached price, less what writes cost above the plain input price)."""
    read, written = summary.get("cache_read_tokens", 0), summary.get("cache_write_tokens", 0)
    if not (read or written):
        return _kpi("Saved by prompt caching", "—", "no prompt tokens read from or written to a cache")
    return _kpi(
        "Saved by prompt caching",
        usd(summary.get("cache_saved_usd", 0.0)),
        f"{read:,} prompt tokens read from a cache · {written:,} written to one",
    )


def _response_cache_kpi(summary: Mapping[str, Any]) -> str:
    """Requests answered from the response cache, the hit rate among those it could answer, and
    what the hits' answers cost when they were first given."""
    cache = summary.get("response_cache") or {}
    hits, misses = cache.get("hits", 0), cache.get("misses", 0)
    if not (hits or misses):
        return _kpi("Saved by the response cache", "—", "no request went through the response cache")
    return _kpi(
        "Saved by the response cache",
        usd(cache.get("saved_usd", 0.0)),
        f"{hits:,} answers from the cache · {percent(cache.get('hit_rate'))} of {hits + misses:,} it could serve",
    )


def _batch_kpi(summary: Mapping[str, Any]) -> str:
    batch = summary["kinds"].get("batch")
    if not batch:
        return _kpi("Batch cost", "—", "no batch requests")
    share = batch["cost_usd"] / summary["cost_usd"] if summary["cost_usd"] else None
    return _kpi(
        "Batch cost", usd(batch["cost_usd"]), f"{batch['requests']:,} batch requests · {percent(share)} of the cost"
    )


COMPARED_ROWS = (
    ("Total cost", "cost_usd", usd),
    ("Requests", "requests", lambda v: f"{v:,}"),
    ("Attempts", "attempts", lambda v: f"{v:,}"),
    ("Prompt tokens", "prompt_tokens", lambda v: f"{v:,}"),
    ("Completion tokens", "completion_tokens", lambda v: f"{v:,}"),
    ("Saved by routing", "savings_usd", usd),
    ("Escalation rate · cascade", "cascade_escalation_rate", percent),
    ("Escalation rate · auto", "auto_escalation_rate", percent),
)


# Which way is good news (coloured green, the other way red); counts of traffic are neither.
BETTER_WHEN = {"cost_usd": -1, "savings_usd": 1, "cascade_escalation_rate": -1, "auto_escalation_rate": -1}


def render_comparison(since: date | None, until: date | None, summary: Mapping[str, Any]) -> str:
    """The headline numbers beside the previous period's, or a line saying why there is none."""
    previous, change = summary.get("previous"), summary.get("change")
    if previous is None or change is None:
        if since is not None and until is not None:
            return ""
        return (
            '<section class="panel" id="previous-period"><h2>Against the previous period</h2>'
            '<p class="empty">No previous period to compare with: this period is open-ended. '
            "Give both its first and its last day (since and until) to see the same number of days "
            "just before it.</p></section>"
        )
    rows = []
    for label, key, shown in COMPARED_ROWS:
        now, before, moved = summary_value(summary, key), previous[key], change[key]
        absolute = moved["absolute"]
        if absolute is None:
            delta = "—"
        elif key.endswith("escalation_rate"):
            delta = f"{absolute * 100:+.1f} pts"
        elif key.endswith("_usd"):
            delta = ("+" if absolute > 0 else "") + usd(absolute)
        else:
            delta = f"{absolute:+,}"
        pct = "—" if moved["pct"] is None else f"{moved['pct']:+.1f}%"
        direction = (absolute > 0) - (absolute < 0) if absolute else 0
        trend = {1: " better", -1: " worse", 0: ""}[direction * BETTER_WHEN.get(key, 0)]
        rows.append(
            f"<tr><td>{escape(label)}</td><td class=num>{escape(shown(now) if now is not None else '—')}</td>"
            f"<td class=num>{escape(shown(before) if before is not None else '—')}</td>"
            f'<td class="num{trend}">{escape(delta)}</td><td class="num{trend}">{escape(pct)}</td></tr>'
        )
    head = (
        f"<tr><th></th><th>this period</th><th>previous: {escape(previous['since'])} → {escape(previous['until'])}"
        "</th><th>change</th><th>change %</th></tr>"
    )
    return (
        '<section class="panel" id="previous-period"><h2>Against the previous period</h2>'
        '<p class="explain">The same number of days just before this period, for the same team filter.</p>'
        f'<div class="scroll"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div></section>'
    )


def summary_value(summary: Mapping[str, Any], key: str) -> Any:
    if key == "savings_usd":
        return summary["savings"]["savings_usd"]
    if key.endswith("_escalation_rate"):
        return summary["escalation"][key.removesuffix("_escalation_rate")]["rate"]
    return summary[key]


def render_team_model(table: Table) -> str:
    """The period's cost as teams (rows) × models (columns), then the table it is read from."""
    model_total: dict[str, float] = defaultdict(float)
    for row in table.records():
        model_total[row["model"]] += row["cost_usd"]
    models = sorted(model_total, key=lambda m: (-model_total[m], m))
    columns = models[:MAX_PIVOT_MODELS] + (["other"] if len(models) > MAX_PIVOT_MODELS else [])
    pivot: dict[str | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # team -> column -> cost
    for row in table.records():
        column = row["model"] if row["model"] in columns else "other"
        for team in (row["team"], None):  # None: the total row
            pivot[team][column] += row["cost_usd"]
            pivot[team]["total"] += row["cost_usd"]
    head = "<tr><th>team</th>" + "".join(f"<th>{escape(c)}</th>" for c in columns) + "<th>total</th></tr>"
    body = []
    teams = sorted((t for t in pivot if t is not None), key=lambda t: (-pivot[t]["total"], t))
    for team in [*teams, None]:
        cells = "".join(f"<td class=num>{usd(pivot[team][c])}</td>" for c in [*columns, "total"])
        name, css = ("total", ' class="total"') if team is None else (team, "")
        body.append(f"<tr{css}><td>{escape(name)}</td>{cells}</tr>")
    return (
        '<section class="panel" id="cost-by-team-model"><h2>Cost by team and model</h2>'
        '<p class="explain">What each team spent on each model over the whole period, every attempt included; '
        f"the {MAX_PIVOT_MODELS} costliest models have a column each, the rest are summed as “other”.</p>"
        f'<div class="scroll"><table><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
        f"{render_table(table)}</section>"
    )


def period_text(since: date | None, until: date | None, summary: Mapping[str, Any]) -> str:
    start = since.isoformat() if since else (summary["first_day"] or "the first record")
    end = until.isoformat() if until else (summary["last_day"] or "the last record")
    return f"{start} → {end} (UTC)"


def render_page(
    *,
    since: date | None,
    until: date | None,
    team: str | None,
    generated_at: datetime,
    summary: Mapping[str, Any],
    plots: Sequence[Plot],
    tables: Mapping[str, Table],
) -> str:
    period = period_text(since, until, summary)
    team_text = team if team is not None else "all teams"
    filters = [("Period", period), ("Team", team_text), ("Records", f"{summary['records']:,}")]
    filters.append(("Generated", generated_at.strftime("%Y-%m-%d %H:%M UTC")))
    header = (
        '<header class="top"><h1>Switchyard usage report</h1>'
        "<p>Cost, routing, escalation, savings and latency from the usage ledger</p>"
        '<dl class="filters">'
        + "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in filters)
        + "</dl></header>"
    )
    if summary["records"] == 0:
        whose = team_text if team is None else f"team {team}"
        body = (
            '<div class="nousage"><h2>No usage</h2>'
            f"<p>No usage was recorded for {escape(whose)} in {escape(period)}. "
            "There is nothing to plot; try a longer period or another team.</p></div>"
        )
        nav = ""
    else:
        links, sections = [], []
        for p in plots:
            links.append((p.id.removeprefix("fig-"), p.title))
            sections.append(render_plot(p, tables))
            if p.id == "fig-cost-by-model" and "cost_by_team_model" in tables:
                links.append(("cost-by-team-model", "Cost by team and model"))
                sections.append(render_team_model(tables["cost_by_team_model"]))
        nav = "<nav>" + "".join(f'<a href="#{anchor}">{escape(title)}</a>' for anchor, title in links) + "</nav>"
        body = render_kpis(summary) + render_comparison(since, until, summary) + "\n".join(sections)
    if "routing_versions" in tables:
        body += render_versions(tables["routing_versions"])
    if "refusals" in tables:
        body += render_refusals(tables["refusals"])
    title = f"Switchyard usage report · {period} · {team_text}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>{header}{nav}\n<main>{body}</main>"
        f"<footer>{FOOTER}</footer></body></html>\n"
    )
