"""Refused requests in the report: counted per team, key and reason, and in no other figure."""

from __future__ import annotations

from switchyard.billing.refusals import refusal_reason, refusal_record
from switchyard.billing.report import build_report
from switchyard.billing.report.tables import build_summary, build_tables
from switchyard.core.errors import BudgetExceeded, InvalidRequest, MalformedJSON, RateLimited, UnsupportedParameter
from tests.unit.billing.test_report import DAY0, DAY1, T0, aggregate, batches_of, ledger_records


def refused(request_id: str, reason: str, at_h: float, team: str | None = "search", key_id: str | None = "key_s"):
    return refusal_record(
        request_id=request_id,
        reason=reason,
        started_at=T0 + at_h * 3600,
        duration_ms=0.5,
        team=team,
        key_id=key_id,
        requested_model="big-c",
    )


REFUSED = [
    refused("x1", "budget", 1.5),
    refused("x2", "budget", 2.5),
    refused("x3", "rate_limit", 26.5, team="support", key_id="key_p"),
    refused("x4", "invalid_json", 27.5, team=None, key_id=None),
]


def test_refused_records_change_no_figure_but_their_own():
    plain = aggregate(ledger_records())
    mixed = aggregate(sorted([*ledger_records(), *REFUSED], key=lambda r: r.started_at))
    plain_tables, mixed_tables = build_tables(plain), build_tables(mixed)
    plain_summary, mixed_summary = build_summary(plain), build_summary(mixed)

    assert {n: t for n, t in mixed_tables.items() if n != "refusals"} == {
        n: t for n, t in plain_tables.items() if n != "refusals"
    }
    assert plain_summary | {"refusals": None} == mixed_summary | {"refusals": None}
    assert plain_tables["refusals"].rows == ()
    assert mixed_tables["refusals"].records() == [
        {"team": "search", "key_id": "key_s", "key_prefix": None, "reason": "budget", "refusals": 2},
        {"team": "(none)", "key_id": "(no key)", "key_prefix": None, "reason": "invalid_json", "refusals": 1},
        {"team": "support", "key_id": "key_p", "key_prefix": None, "reason": "rate_limit", "refusals": 1},
    ]
    assert mixed_summary["refusals"] == {
        "total": 4,
        "by_reason": {"budget": 2, "invalid_json": 1, "rate_limit": 1},
        "by_team": {"(none)": {"invalid_json": 1}, "search": {"budget": 2}, "support": {"rate_limit": 1}},
    }


def test_refusals_follow_the_period_and_team_filters():
    records = sorted([*ledger_records(), *REFUSED], key=lambda r: r.started_at)
    only_day1 = aggregate(records, since=DAY1)
    support = aggregate(records, team="support")
    assert build_summary(only_day1)["refusals"]["by_reason"] == {"invalid_json": 1, "rate_limit": 1}
    assert build_summary(support)["refusals"]["by_team"] == {"support": {"rate_limit": 1}}
    assert build_summary(aggregate(records, until=DAY0))["refusals"]["total"] == 2
    assert build_tables(support, key_prefixes={"key_p": "sk-sy-abc…"})["refusals"].rows == (
        ("support", "key_p", "sk-sy-abc…", "rate_limit", 1),
    )


def test_a_refusals_reason_is_its_error_code_with_the_common_ones_shortened():
    assert refusal_reason(BudgetExceeded("spent")) == "budget"
    assert refusal_reason(RateLimited("too fast")) == "rate_limit"
    assert refusal_reason(UnsupportedParameter("no tools")) == "unsupported_parameter"
    assert refusal_reason(MalformedJSON("{")) == "invalid_json"
    assert refusal_reason(InvalidRequest("bad")) == "invalid_request"  # no code: its type


async def test_a_period_of_refusals_only_is_a_no_usage_page_with_its_refusals():
    report = await build_report(batches_of(REFUSED[:2]))
    page = report.html()
    assert report.is_empty and report.figure_ids == []
    assert "No usage" in page and '<section class="panel" id="refusals">' in page
    assert "2 requests answered with an error before any model was called" in page
    assert "refusals.csv" in report.summary_json()["files"]
