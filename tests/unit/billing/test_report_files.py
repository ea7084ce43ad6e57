"""The report's files and page: CSV and JSON that parse back to the numbers, a self-contained page."""

from __future__ import annotations

import asyncio
import csv
import json
import re
from datetime import date

import pytest
from matplotlib.ticker import MultipleLocator

from switchyard.billing.report import COLUMNS, HTML_FILE, SUMMARY_FILE, Report, Table, build_report
from switchyard.billing.report.page import render_table, usd
from switchyard.billing.report.plots import UsdFormatter, _top_series
from switchyard.billing.report.svg import new_figure
from switchyard.billing.report.tables import build_summary, build_tables
from switchyard.core.prices import Price
from tests.unit.billing.test_report import DAY0, DAY1, aggregate, batches_of, ledger_records, rec

ALL_FIGURES = [
    "fig-cost-by-team",
    "fig-cost-by-model",
    "fig-route-mix",
    "fig-escalation",
    "fig-savings",
    "fig-hosting",
    "fig-latency",
]
EXTERNAL = [
    re.compile(r"""\b(?:src|href|xlink:href)\s*=\s*["']?\s*(?:https?:)?//""", re.I),
    re.compile(r"""url\(\s*["']?\s*(?:https?:)?//""", re.I),
    re.compile(r"@import", re.I),
    re.compile(r"<(?:script|link|img|iframe|object|embed)\b", re.I),
]


def build(records, **kwargs) -> Report:
    return asyncio.run(build_report(batches_of(records), **kwargs))


@pytest.fixture(scope="module")
def report() -> Report:
    return build(ledger_records(), prices={"big-c": Price(2.5, 10.0)}, since=DAY0, until=DAY1, team=None)


@pytest.fixture(scope="module")
def page(report: Report) -> str:
    return report.html()


def test_batches_stream_into_the_numbers_worked_out_by_hand(report: Report) -> None:
    assert report.summary == build_summary(aggregate(ledger_records()))
    assert report.tables["route_mix"] == build_tables(aggregate(ledger_records()))["route_mix"]


def test_write_produces_csv_files_a_summary_and_the_page(report: Report, tmp_path) -> None:
    paths = report.write(tmp_path / "out")
    names = [p.name for p in paths]
    assert names == [f"{name}.csv" for name in COLUMNS] + [SUMMARY_FILE, HTML_FILE]
    assert all(p.parent == tmp_path / "out" and p.stat().st_size > 0 for p in paths)
    for name, columns in COLUMNS.items():
        with open(tmp_path / "out" / f"{name}.csv", newline="") as f:
            rows = list(csv.reader(f))
        assert tuple(rows[0]) == columns
        assert len(rows) - 1 == len(report.tables[name].rows)
    with open(tmp_path / "out" / "route_mix.csv", newline="") as f:
        mix = {row["route"]: row for row in csv.DictReader(f)}
    assert mix["cascade:escalated"] == {
        "route": "cascade:escalated",
        "requests": "2",
        "share": "0.2",
        "as_routed": "2",
        "fallback": "0",
        "degraded": "0",
        "failed": "0",
        "cost_usd": "0.02",
    }
    with open(tmp_path / "out" / "latency_by_model.csv", newline="") as f:
        latency = {row["model"]: row for row in csv.DictReader(f)}
    assert (latency["shadow-m"]["p50_ttft_ms"], latency["big-c"]["p50_latency_ms"]) == ("", "2500.0")
    with open(tmp_path / "out" / "cost_by_team_day.csv", newline="") as f:
        assert next(csv.DictReader(f))["day"] == "2026-11-02"
    assert (tmp_path / "out" / HTML_FILE).read_text() == report.html()


def test_summary_json(report: Report, tmp_path) -> None:
    report.write(tmp_path)
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert summary["object"] == "switchyard.report"
    assert (summary["since"], summary["until"], summary["team"]) == ("2026-11-02", "2026-11-03", None)
    assert (summary["requests"], summary["records"]) == (10, 16)
    assert summary["cost_usd"] == pytest.approx(0.0445)
    assert summary["savings"]["savings_usd"] == pytest.approx(0.040)
    assert summary["escalation"]["cascade"]["reasons"] == {"low-confidence": 2}
    assert summary["files"][-2:] == [SUMMARY_FILE, HTML_FILE]
    assert "generated_at" in summary


def test_every_figure_is_an_inline_svg_with_drawn_marks(report: Report, page: str) -> None:
    assert report.figure_ids == ALL_FIGURES
    for figure_id in ALL_FIGURES:
        figure = re.search(rf'<figure id="{figure_id}"[^>]*>(.*?)</figure>', page, re.S)
        assert figure, figure_id
        assert figure.group(1).lstrip().startswith("<svg")
        assert f'id="{figure_id}-mark-1"' in figure.group(1)
    assert page.count("<figure") == len(ALL_FIGURES)


def test_the_page_has_the_header_headline_numbers_and_tables(page: str) -> None:
    assert "2026-11-02 → 2026-11-03 (UTC)" in page
    assert "<dd>all teams</dd>" in page
    assert "$0.0445" in page  # total cost
    assert "$0.0400" in page  # saved by routing
    assert "50.0%" in page  # the cascade's escalation rate
    assert "2 of 4 cascade requests answered by a higher rung" in page
    # no batch lines, refusals, client-seen times or judged answers here: no table (a note instead)
    empty = {"cost_by_kind_day", "refusals", "latency_by_route", "confidence_by_model", "confidence_histogram"}
    empty.add("routing_versions")  # no routing version recorded: no panel
    empty |= {"drift", "drift_by_day", "drift_bins"}  # no thresholds file given: no reference
    for name in COLUMNS:
        if name not in empty:
            assert f"Data: {name}.csv" in page
    assert "No batch requests in this period" in page
    # + cost by team and model; + the confidence, client latency and drift panels, which say why they are empty
    assert page.count('<p class="explain">') == len(ALL_FIGURES) + 2 + 3


def test_the_page_references_nothing_outside_itself(page: str) -> None:
    for pattern in EXTERNAL:
        assert not pattern.search(page), pattern.pattern


def test_ids_are_unique_across_figures(page: str) -> None:
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    refs = re.findall(r'(?:href="#|url\(#)([^")]+)', page)
    assert refs and set(refs) <= set(ids)  # every reference (glyphs, clip paths, the nav) resolves


def test_names_from_the_ledger_are_escaped() -> None:
    records = [rec("a", 1, 1.0, "m$1$", "completed", 0.0, team="<script>alert(1)</script>", requested_model="m")]
    page = build(records, team="<script>alert(1)</script>").html()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_an_empty_period_is_a_no_usage_page(tmp_path) -> None:
    report = build([], since=date(2026, 1, 1), until=date(2026, 1, 31), team="search")
    assert report.is_empty and report.figure_ids == []
    page = report.html()
    assert "No usage was recorded for team search in 2026-01-01" in page and "<figure" not in page
    assert "2026-01-01 → 2026-01-31 (UTC)" in page and "<dd>search</dd>" in page
    paths = report.write(tmp_path)
    assert len(paths) == len(COLUMNS) + 2
    with open(tmp_path / "models.csv", newline="") as f:
        assert list(csv.reader(f)) == [list(COLUMNS["models"])]
    summary = json.loads((tmp_path / SUMMARY_FILE).read_text())
    assert (summary["records"], summary["cost_usd"], summary["escalation"]["cascade"]["rate"]) == (0, 0.0, None)


def test_records_outside_the_filters_only_is_an_empty_report() -> None:
    report = build(ledger_records(), team="nobody")
    assert report.is_empty and "No usage" in report.html()


def test_sections_without_data_say_so_instead_of_plotting() -> None:
    records = [rec("a", 1, 1.0, "big-c", "completed", 0.002, requested_model="big-c", hosting="commercial")]
    report = build(records)
    assert report.figure_ids == ["fig-cost-by-team", "fig-cost-by-model", "fig-route-mix", "fig-hosting", "fig-latency"]
    page = report.html()
    assert "No auto or cascade requests in this period." in page
    assert "No routed (auto or cascade) requests with a cost in this period." in page


def test_progress_bar_on_stderr(capsys) -> None:
    build(ledger_records(), team="nobody", total=16, progress=True)
    err = capsys.readouterr().err
    assert "reading usage" in err and "16/16" in err


def test_a_period_where_everything_was_free_plots_no_cost() -> None:
    records = [rec("a", 1, 1.0, "small-m", "completed", 0.0, requested_model="auto", hosting="self-hosted")]
    report = build(records)
    assert report.figure_ids == ["fig-route-mix", "fig-escalation", "fig-latency"]
    assert report.html().count("No cost in this period: every attempt was free.") == 2


async def test_reports_built_side_by_side_draw_every_figure() -> None:
    """/admin/report may be asked twice at once: matplotlib draws one report at a time."""
    records = [rec("a", 1, 1.0, "small-m", "completed", 0.0, requested_model="small-m")]  # two figures: quick
    first, second = await asyncio.gather(build_report(batches_of(records)), build_report(batches_of(records)))
    assert first.figure_ids == second.figure_ids == ["fig-route-mix", "fig-latency"]
    assert [p.svg for p in first.plots] == [p.svg for p in second.plots]


def test_more_series_than_colours_are_summed_as_other() -> None:
    rows = tuple((DAY0, f"team-{i}", 1, 1, 0, 0, float(i + 1)) for i in range(10))
    series = _top_series(Table("cost_by_team_day", COLUMNS["cost_by_team_day"], rows), "team", "cost_usd")
    assert list(series) == [f"team-{i}" for i in range(9, 1, -1)] + ["other"]
    assert series["other"][DAY0] == 1.0 + 2.0
    assert sum(values[DAY0] for values in series.values()) == sum(range(1, 11))


def test_long_tables_show_their_first_rows_and_point_at_the_csv() -> None:
    rows = tuple((DAY0, "cascade", f"r{i}", i) for i in range(250))
    table = Table("escalation_reasons", COLUMNS["escalation_reasons"], rows)
    rendered = render_table(table)
    assert "Data: escalation_reasons.csv (250 rows, first 200 shown)" in rendered
    assert rendered.count("<tr>") == 201 and "<details>" in rendered  # closed: too long to open by default


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "—"), (0.0, "$0"), (1234.5, "$1,234.50"), (0.0445, "$0.0445"), (0.000123, "$0.000123"), (-3, "-$3.00")],
)
def test_dollars_on_the_page(value, text) -> None:
    assert usd(value) == text


def test_dollar_ticks_keep_the_precision_of_the_tick_spacing() -> None:
    figure = new_figure()
    ax = figure.add_subplot()
    ax.plot([0, 1], [0, 0.175])
    ax.set_ylim(0, 0.175)
    ax.yaxis.set_major_locator(MultipleLocator(0.025))
    ax.yaxis.set_major_formatter(UsdFormatter())
    figure.canvas.draw()
    ticks = [(t.get_position()[1], t.get_text()) for t in ax.get_yticklabels() if t.get_text()]
    assert len(ticks) >= 4
    for value, text in ticks:
        assert "$" in text and float(text.replace("$", "")) == pytest.approx(value)  # $0.025, never $0.03
    assert ("$0.075" in dict(ticks).values()) and (-0.025, "-$0.025") in ticks


def test_batch_lines_are_costed_apart_from_interactive_requests() -> None:
    records = [
        rec("i1", 1, 1.0, "small-m", "completed", 0.25, requested_model="small-m"),
        rec("b1", 1, 2.0, "small-m", "completed", 0.5, requested_model="small-m", batch_id="batch_1"),
        rec("b1", 2, 2.0, "small-m", "failed", 0.25, requested_model="small-m", batch_id="batch_1"),
        rec("b2", 1, 3.0, "small-m", "completed", 0.5, requested_model="small-m", batch_id="batch_1"),
    ]
    report = build(records)
    assert "fig-cost-by-kind" in report.figure_ids
    rows = {
        (r["kind"]): (r["requests"], r["attempts"], r["cost_usd"]) for r in report.tables["cost_by_kind_day"].records()
    }
    assert rows == {"interactive": (1, 1, 0.25), "batch": (2, 3, 1.25)}
    kinds = report.summary_json()["kinds"]
    assert kinds["batch"]["requests"] == 2 and kinds["batch"]["cost_usd"] == pytest.approx(1.25)
    assert "2 batch requests · 83.3% of the cost" in report.html()
    without = build(records[:1])
    assert "fig-cost-by-kind" not in without.figure_ids
    assert "No batch requests in this period" in without.html()
