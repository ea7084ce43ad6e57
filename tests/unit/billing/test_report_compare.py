"""What analysts compare in the report: teams against models, the period against the one before,
self-hosted against commercial; and a period of a single day drawn as one day."""

from __future__ import annotations

import asyncio
import csv
import json
import re
from datetime import date

import pytest

from switchyard.billing.metering import hosting_of
from switchyard.billing.report import Report, build_report, previous_period
from switchyard.billing.report.plots import FEW_DAYS
from switchyard.core.model_settings import hosting_overrides
from switchyard.core.settings import Settings
from tests.unit.billing.test_report import DAY0, DAY1, batches_of, rec

DATE_LABEL = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def build(records, **kwargs) -> Report:
    return asyncio.run(build_report(batches_of(records), **kwargs))


def texts(svg: str) -> list[str]:
    """The text an SVG figure shows (matplotlib draws glyphs, and writes each text beside them as a comment)."""
    return re.findall(r"<!-- (.*?) -->", svg)


def figure(report: Report, figure_id: str) -> str:
    (svg,) = [p.svg for p in report.plots if p.id == figure_id]
    assert svg is not None
    return svg


TEAM_MODEL_RECORDS = [
    rec("a1", 1, 1.0, "small-m", "completed", 0.25, team="search", requested_model="small-m"),
    rec("a2", 1, 2.0, "small-m", "failed", 0.0, team="search", requested_model="auto"),
    rec("a2", 2, 2.1, "big-c", "completed", 1.0, team="search", requested_model="auto"),
    rec("b1", 1, 3.0, "big-c", "completed", 2.0, team="ads", requested_model="big-c"),
    rec("n1", 1, 25.0, "small-m", "completed", 0.5, requested_model="small-m"),
]


def test_cost_by_team_and_model_in_the_csv_the_summary_and_the_page(tmp_path) -> None:
    report = build(TEAM_MODEL_RECORDS)
    assert [tuple(r.values()) for r in report.tables["cost_by_team_model"].records()] == [
        # team, model, requests (first attempts), attempts, prompt, completion, cost, cache read, cache written
        ("(none)", "small-m", 1, 1, 100, 50, 0.5, 0, 0),
        ("ads", "big-c", 1, 1, 100, 50, 2.0, 0, 0),
        ("search", "big-c", 0, 1, 100, 50, 1.0, 0, 0),
        ("search", "small-m", 2, 2, 100, 50, 0.25, 0, 0),
    ]
    report.write(tmp_path)
    with open(tmp_path / "cost_by_team_model.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[1] == {
        "team": "ads",
        "model": "big-c",
        "requests": "1",
        "attempts": "1",
        "prompt_tokens": "100",
        "completion_tokens": "50",
        "cost_usd": "2.0",
        "cache_read_tokens": "0",
        "cache_write_tokens": "0",
    }
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cost_by_team_model"]["search"] == {
        "big-c": {"requests": 0, "tokens": 150, "cost_usd": 1.0},
        "small-m": {"requests": 2, "tokens": 150, "cost_usd": 0.25},
    }
    page = report.html()
    section = page.split('<section class="panel" id="cost-by-team-model">', 1)[1].split("</section>", 1)[0]
    header, *lines = re.findall(r"<tr[^>]*>(.*?)</tr>", section.split("<details", 1)[0])
    assert re.findall(r"<th>(.*?)</th>", header) == ["team", "big-c", "small-m", "total"]  # costliest model first
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", line) for line in lines]
    assert cells == [
        ["ads", "$2.00", "$0", "$2.00"],
        ["search", "$1.00", "$0.2500", "$1.25"],
        ["(none)", "$0", "$0.5000", "$0.5000"],
        ["total", "$3.00", "$0.7500", "$3.75"],
    ]
    assert "Data: cost_by_team_model.csv (4 rows)" in section
    assert '<a href="#cost-by-team-model">' in page


@pytest.mark.parametrize(
    ("since", "until", "previous"),
    [
        (date(2026, 11, 10), date(2026, 11, 12), (date(2026, 11, 7), date(2026, 11, 9))),
        (date(2026, 3, 1), date(2026, 3, 31), (date(2026, 1, 29), date(2026, 2, 28))),  # 31 days, across February
        (DAY1, DAY1, (DAY0, DAY0)),
        (None, DAY1, None),
        (DAY0, None, None),
        (DAY1, DAY0, None),
        (date(7, 1, 5), date(2026, 1, 5), None),  # it would start before year 1
        (date(1, 1, 2), date(1, 1, 2), (date(1, 1, 1), date(1, 1, 1))),
    ],
)
def test_the_previous_period_is_as_long_and_just_before(since, until, previous) -> None:
    assert previous_period(since, until) == previous


def test_a_bounded_period_is_compared_with_the_one_before(tmp_path) -> None:
    before = [
        rec("p1", 1, 1.0, "small-m", "completed", 0.1, team="search", requested_model="small-m"),
        rec("p2", 1, 2.0, "small-m", "completed", 0.2, team="search", requested_model="small-m"),
    ]
    now = [
        rec("c1", 1, 25.0, "small-m", "completed", 0.1, team="search", requested_model="small-m"),
        rec("c2", 1, 26.0, "small-m", "completed", 0.2, team="search", requested_model="small-m"),
        rec("c3", 1, 27.0, "big-c", "completed", 0.15, team="search", requested_model="big-c"),
    ]
    report = asyncio.run(
        build_report(batches_of(now), since=DAY1, until=DAY1, team="search", previous_batches=batches_of(before))
    )
    report.write(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["previous"] == {
        "since": "2026-11-02",
        "until": "2026-11-02",
        "records": 2,
        "cost_usd": 0.3,  # 0.1 + 0.2 is 0.30000000000000004 before rounding
        "requests": 2,
        "attempts": 2,
        "prompt_tokens": 200,
        "completion_tokens": 100,
        "savings_usd": 0.0,
        "cascade_escalation_rate": None,
        "auto_escalation_rate": None,
    }
    assert summary["change"]["cost_usd"] == {"absolute": 0.15, "pct": pytest.approx(50.0)}
    assert summary["change"]["requests"] == {"absolute": 1, "pct": 50.0}
    assert summary["change"]["savings_usd"] == {"absolute": 0.0, "pct": None}  # nothing to divide by
    assert summary["change"]["cascade_escalation_rate"] == {"absolute": None, "pct": None}
    page = report.html()
    section = page.split('id="previous-period">', 1)[1].split("</section>", 1)[0]
    assert "previous: 2026-11-02 → 2026-11-02" in section
    assert re.search(r"<td>Total cost</td><td class=num>\$0\.4500</td><td class=num>\$0\.3000</td>", section)
    assert '<td class="num worse">+$0.1500</td><td class="num worse">+50.0%</td>' in section  # more cost: red
    assert '<td class="num">+1</td><td class="num">+50.0%</td>' in section  # more requests: neither


def test_an_open_ended_period_says_there_is_no_previous_one(tmp_path) -> None:
    report = build(TEAM_MODEL_RECORDS, since=DAY0)
    report.write(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["previous"], summary["change"]) == (None, None)
    assert "No previous period to compare with: this period is open-ended." in report.html()


def test_money_in_the_summary_is_rounded_and_nothing_else() -> None:
    records = [
        rec(f"r{i}", 1, 1.0 + i / 10, "small-m", "completed", cost, team="search", requested_model="small-m")
        for i, cost in enumerate((0.1, 0.2, 0.02793500000000001))
    ]
    summary = build(records).summary_json()
    assert summary["cost_usd"] == 0.327935 and summary["hosting"]["unknown"]["cost_usd"] == 0.327935
    assert summary["hosting"]["unknown"]["usd_per_mtok"] == round(0.327935 / 450 * 1e6, 8)
    assert summary["cost_by_team_model"]["search"]["small-m"]["cost_usd"] == 0.327935
    assert summary["requests"] == 3 and isinstance(summary["requests"], int)


def test_a_single_day_is_one_labelled_day_on_the_axis() -> None:
    report = build(TEAM_MODEL_RECORDS[:4], since=DAY0, until=DAY0)
    for figure_id in ("fig-cost-by-team", "fig-cost-by-model"):
        labels = texts(figure(report, figure_id))
        assert [t for t in labels if DATE_LABEL.match(t)] == ["2026-11-02"], figure_id


def test_a_few_days_get_a_tick_each_and_no_empty_day_around_them() -> None:
    records = [
        rec(f"d{i}", 1, 1.0 + 24 * i, "small-m", "completed", 0.1, team="search", requested_model="small-m")
        for i in (0, 1, 3)
    ]
    labels = texts(figure(build(records), "fig-cost-by-team"))
    assert labels[:5] == ["02", "03", "04", "05", "day (UTC)"]  # the four days of the period, no 1st or 6th
    assert "2026-Nov" in labels
    assert FEW_DAYS >= 4


def test_the_savings_of_a_single_day_are_two_bars_with_their_amounts() -> None:
    records = [
        rec("s1", 1, 1.0, "small-m", "completed", 0.002, team="search", requested_model="auto",
            ceiling_cost_usd=0.02, tier="small"),
        rec("s2", 1, 2.0, "small-m", "completed", 0.002, team="search", requested_model="auto",
            ceiling_cost_usd=0.01, tier="small"),
    ]  # fmt: skip
    svg = figure(build(records, since=DAY0, until=DAY0), "fig-savings")
    labels = texts(svg)
    assert [t for t in labels if DATE_LABEL.match(t)] == ["2026-11-02"]
    assert "$0.0300" in labels and "$0.0040" in labels  # each bar's amount
    assert "routing saved $0.0260 (86.7%)" in labels
    assert 'id="fig-savings-mark-2"' in svg and 'id="fig-savings-mark-3"' not in svg  # two bars, no lines


def test_the_config_says_where_a_model_runs_and_the_report_believes_it() -> None:
    settings = Settings(
        models=[
            {"name": "gpu-llama", "backend": "openai", "base_url": "http://127.0.0.1:9/v1", "hosting": "self"},
            {"name": "cloud", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"},
            {
                "name": "rented",
                "backend": "vllm",
                "base_url": "http://127.0.0.1:9/v1",
                "hosting": "commercial",
                "adapters": [{"name": "rented-sql", "path": "/adapters/sql"}],
            },
            {"name": "own", "backend": "vllm", "base_url": "http://127.0.0.1:9/v1"},
        ]
    )
    labels = {m.name: m.hosting_label for m in settings.models}
    assert labels == {"gpu-llama": "self-hosted", "cloud": "commercial", "rented": "commercial", "own": "self-hosted"}
    overrides = hosting_overrides(settings.models)
    assert overrides == {"gpu-llama": "self-hosted", "rented": "commercial", "rented-sql": "commercial"}
    # older records of gpu-llama say what its backend made of it: the setting wins in the report
    records = [
        rec("g1", 1, 1.0, "gpu-llama", "completed", 0.001, hosting="commercial", requested_model="gpu-llama"),
        rec("c1", 1, 2.0, "cloud", "completed", 0.003, hosting="commercial", requested_model="cloud"),
    ]
    report = build(records, hosting=overrides)
    hosting = report.summary_json()["hosting"]
    assert hosting["self-hosted"] == {"tokens": 150, "cost_usd": 0.001, "usd_per_mtok": round(0.001 / 150 * 1e6, 8)}
    assert hosting["commercial"]["cost_usd"] == 0.003
    assert {r["model"]: r["hosting"] for r in report.tables["models"].records()} == {
        "cloud": "commercial",
        "gpu-llama": "self-hosted",
    }


@pytest.mark.parametrize(
    ("backend_kind", "hosting", "recorded"),
    [("openai", None, "commercial"), ("vllm", None, "self-hosted"), ("openai", "self-hosted", "self-hosted")],
)
def test_metering_records_the_models_hosting(backend_kind, hosting, recorded) -> None:
    class Entry:
        name, tier = "m", None

    entry = Entry()
    entry.backend_kind, entry.hosting = backend_kind, hosting  # type: ignore[attr-defined]
    assert hosting_of(entry) == recorded  # type: ignore[arg-type]


def test_an_unknown_hosting_is_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError, match="hosting"):
        Settings(models=[{"name": "m", "base_url": "http://127.0.0.1:9/v1", "hosting": "cloud"}])


def test_prompt_cache_tokens_and_what_they_saved_in_the_models_table_the_summary_and_the_page() -> None:
    from switchyard.core.prices import Price

    price = Price(3.0, 15.0, cached_input_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75)
    records = [
        # 100 prompt tokens each: the first wrote 80 to the cache, the next two read them
        rec("c1", 1, 1.0, "claude", "completed", 0.0, cache_read_tokens=0, cache_write_tokens=80),
        rec("c2", 1, 2.0, "claude", "completed", 0.0, cache_read_tokens=80, cache_write_tokens=0),
        rec("c3", 1, 3.0, "claude", "completed", 0.0, cache_read_tokens=80, cache_write_tokens=0),
        rec("o1", 1, 4.0, "small-m", "completed", 0.0),  # an old row: no cache counts
    ]
    report = build(records, prices={"claude": price})
    models = {row["model"]: row for row in report.tables["models"].records()}
    saved = (160 * (3.0 - 0.3) - 80 * (3.75 - 3.0)) / 1e6
    claude = models["claude"]
    assert (claude["cache_read_tokens"], claude["cache_write_tokens"]) == (160, 80)
    assert claude["cache_saved_usd"] == pytest.approx(saved)
    assert (claude["price_cached_input_usd_per_mtok"], claude["price_cache_write_usd_per_mtok"]) == (0.3, 3.75)
    assert (models["small-m"]["cache_read_tokens"], models["small-m"]["cache_saved_usd"]) == (0, None)  # no price
    summary = report.summary_json()
    assert (summary["cache_read_tokens"], summary["cache_write_tokens"]) == (160, 80)
    assert summary["cache_saved_usd"] == pytest.approx(saved)
    assert "Saved by prompt caching" in report.html() and "160 prompt tokens read from a cache" in report.html()


def test_response_cache_hits_their_rate_and_what_they_saved_in_the_summary_and_the_page() -> None:
    records = [
        rec("h1", 1, 1.0, "claude", "completed", 0.0, response_cache="hit", response_cache_saved_usd=0.002),
        rec("h2", 1, 2.0, "claude", "completed", 0.0, response_cache="hit", response_cache_saved_usd=0.003),
        rec("m1", 1, 3.0, "claude", "completed", 0.0, response_cache="miss"),
        rec("b1", 1, 4.0, "claude", "completed", 0.0, response_cache="bypass"),  # not one it could serve
        rec("o1", 1, 5.0, "small-m", "completed", 0.0),  # the cache had nothing to do with it
    ]
    report = build(records)
    cache = report.summary_json()["response_cache"]
    assert (cache["hits"], cache["misses"]) == (2, 1)
    assert cache["hit_rate"] == pytest.approx(2 / 3) and cache["saved_usd"] == pytest.approx(0.005)
    assert "Saved by the response cache" in report.html() and "2 answers from the cache · 66.7% of 3" in report.html()
    assert build([rec("o1", 1, 5.0, "small-m", "completed", 0.0)]).summary_json()["response_cache"]["hit_rate"] is None
