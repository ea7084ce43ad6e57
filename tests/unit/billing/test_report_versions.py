"""The report's routing versions: each version's auto and cascade requests side by side (cost per
request, escalation, strong-call share, judged quality where labels exist), in its table, the
summary and the page; the judged quality joined from the learning rows."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.billing.report import build_report
from switchyard.billing.report.tables import build_summary, build_tables
from switchyard.billing.report.versions import COLUMNS
from switchyard.billing.store import open_database
from switchyard.learning.rows import LearningRow, insert_row, judged_answers
from tests.unit.billing.test_report import aggregate, batches_of, rec

CURRENT, CANDIDATE = "v-aaaaaaaaaaaa", "v-bbbbbbbbbbbb"


def _records() -> list:
    auto, cascade = {"requested_model": "auto"}, {"requested_model": "cascade"}
    return [
        # current, auto: one on the strong model (its cost is the ceiling), one on the weak one
        rec("a1", 1, 0.0, "big", "completed", 0.010, routing_version=CURRENT, ceiling_cost_usd=0.010, **auto),
        rec("a2", 1, 0.1, "small", "completed", 0.001, routing_version=CURRENT, ceiling_cost_usd=0.010, **auto),
        # candidate, auto: both weak
        rec("b1", 1, 0.2, "small", "completed", 0.001, routing_version=CANDIDATE, ceiling_cost_usd=0.010, **auto),
        rec("b2", 1, 0.3, "small", "completed", 0.002, routing_version=CANDIDATE, ceiling_cost_usd=0.020, **auto),
        # candidate, cascade: judged and dropped on small, answered by big (escalated)
        rec("c1", 1, 0.4, "small", "escalated", 0.001, routing_version=CANDIDATE, **cascade),
        rec(
            "c1", 2, 0.4, "big", "completed", 0.010, routing_version=CANDIDATE, escalated_from="small",
            ceiling_cost_usd=0.010, **cascade,
        ),
        # an explicit model and a row from before versions were kept: in no version's row
        rec("d1", 1, 0.5, "small", "completed", 0.001, requested_model="small"),
        rec("e1", 1, 0.6, "small", "completed", 0.001, **auto),
    ]  # fmt: skip


def test_each_version_and_entry_gets_its_row():
    judged = {"a1": 1.0, "a2": 0.0, "b1": 1.0, "b2": 1.0}
    table = build_tables(aggregate(_records(), judged=judged))["routing_versions"]
    assert table.columns == COLUMNS
    rows = [dict(zip(COLUMNS, row, strict=True)) for row in table.rows]
    assert [(r["version"], r["entry"]) for r in rows] == [
        (CANDIDATE, "auto"),
        (CANDIDATE, "cascade"),
        (CURRENT, "auto"),
    ]
    candidate_auto, candidate_cascade, current_auto = rows
    assert current_auto["requests"] == 2 and current_auto["cost_per_request_usd"] == pytest.approx(0.0055)
    assert current_auto["strong_share"] == 0.5 and current_auto["judged_quality"] == 0.5
    assert candidate_auto["cost_per_request_usd"] == pytest.approx(0.0015)
    assert candidate_auto["strong_share"] == 0.0 and candidate_auto["judged_quality"] == 1.0
    assert candidate_auto["escalation_rate"] == 0.0
    assert candidate_cascade["escalated_requests"] == 1 and candidate_cascade["escalation_rate"] == 1.0
    assert candidate_cascade["cost_usd"] == pytest.approx(0.011) and candidate_cascade["strong_share"] == 1.0
    assert candidate_cascade["judged_requests"] == 0 and candidate_cascade["judged_quality"] is None


def test_without_labels_quality_is_empty_and_the_summary_and_page_show_the_versions():
    summary = build_summary(aggregate(_records()))
    assert {(v["version"], v["entry"]) for v in summary["routing_versions"]} == {
        (CANDIDATE, "auto"),
        (CANDIDATE, "cascade"),
        (CURRENT, "auto"),
    }
    assert all(v["judged_quality"] is None for v in summary["routing_versions"])
    report = asyncio.run(build_report(batches_of(_records())))
    page = report.html()
    assert 'id="routing-versions"' in page and CANDIDATE in page and "50.0%" in page  # the current's strong share
    assert "routing_versions.csv" in report.summary_json()["files"]


def test_no_versions_no_panel():
    records = [r for r in _records() if r.routing_version is None]
    report = asyncio.run(build_report(batches_of(records)))
    assert report.tables["routing_versions"].rows == () and 'id="routing-versions"' not in report.html()


async def test_judged_answers_join_the_learning_rows_by_request_id(tmp_path):
    """The quality of the answer the client got: the label's for the answering model, else the
    client's feedback; a row with neither is left out."""
    database = await open_database(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        labelled = {"small": {"answered": True, "quality": 0.0}, "big": {"answered": False, "quality": 1.0}}
        for row in (
            LearningRow("a1", 1.0, None, "auto", "k1", labelled, label_source="judge"),
            LearningRow("a2", 2.0, None, "auto", "k2", {"small": {"answered": True}}, feedback=0.8),
            LearningRow("a3", 3.0, None, "auto", "k3", {"small": {"answered": True}}),
            LearningRow("a4", 99.0, None, "auto", "k4", labelled, label_source="judge"),
        ):
            await insert_row(database, row)
        assert await judged_answers(database, since=0.0, until=50.0) == {"a1": 0.0, "a2": 0.8}
    finally:
        await database.aclose()
