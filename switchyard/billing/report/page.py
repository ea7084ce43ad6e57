"""The report as one self-contained HTML page: inline CSS and SVG, no script, no external resource.

A header with the period and the team filter, the headline numbers, then one section per figure:
its plot, a line on how to read it, and its tables. An empty period is a page that says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from html import escape
from typing import Any

from switchyard.billing.report.plots import Plot
from switchyard.billing.report.tables import Cell, Table

FOOTER = "switchyard report --out DIR writes the same numbers as CSV files and summary.json."
MAX_TABLE_ROWS = 200  # beyond this the page shows the first rows and points at the CSV file

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
    if column in ("share", "escalation_rate"):
        return percent(value), True
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
        _kpi(
            "Escalation rate",
            percent(escalation["rate"]),
            f"{escalation['escalated_requests']:,} of {escalation['cascade_requests']:,} cascade requests",
        ),
        _batch_kpi(summary),
        _kpi(
            "Self-hosted tokens",
            percent(self_hosted["tokens"] / tokens) if self_hosted and tokens else "—",
            f"{usd(self_hosted.get('usd_per_mtok'))} vs {usd(commercial.get('usd_per_mtok'))} commercial per 1M",
        ),
    ]
    return '<section class="kpis">' + "".join(cards) + "</section>"


def _batch_kpi(summary: Mapping[str, Any]) -> str:
    batch = summary["kinds"].get("batch")
    if not batch:
        return _kpi("Batch cost", "—", "no batch requests")
    share = batch["cost_usd"] / summary["cost_usd"] if summary["cost_usd"] else None
    return _kpi(
        "Batch cost", usd(batch["cost_usd"]), f"{batch['requests']:,} batch requests · {percent(share)} of the cost"
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
        nav = "<nav>" + "".join(f'<a href="#{p.id.removeprefix("fig-")}">{escape(p.title)}</a>' for p in plots)
        nav += "</nav>"
        body = render_kpis(summary) + "\n".join(render_plot(p, tables) for p in plots)
    title = f"Switchyard usage report · {period} · {team_text}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>{header}{nav}\n<main>{body}</main>"
        f"<footer>{FOOTER}</footer></body></html>\n"
    )
