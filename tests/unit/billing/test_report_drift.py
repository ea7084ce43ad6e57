"""The report's Drift section: the ledger's scores and confidences against the thresholds file's
reference, per day and over the period, worked out by hand."""

from __future__ import annotations

import asyncio
import math

import pytest

from switchyard.billing.report import DriftReferences, Report, build_report
from switchyard.core.thresholds import ThresholdsFile
from tests.unit.billing.test_report import DAY0, DAY1, batches_of, rec

THRESHOLDS = ThresholdsFile.model_validate(
    {
        "version": 1,
        "routing": {
            "router": "classifier",
            "threshold": 0.5,
            "reference": {"edges": [0.5], "shares": [0.5, 0.5], "num_samples": 1000, "rate": 0.5},
        },
        "cascade": {
            "rungs": {
                "cheap": {
                    "scorer": {"kind": "feature", "feature": "mean_logprob"},
                    "threshold": -1.0,
                    "reference": {"edges": [-1.0], "shares": [0.3, 0.7], "num_samples": 500, "rate": 0.3},
                }
            }
        },
    }
)


def _auto(request_id: str, at_h: float, score: float, attempt: int = 1, **extra):
    return rec(request_id, attempt, at_h, "small-m", "completed", 0.001, requested_model="auto", score=score, **extra)


def _judged(request_id: str, at_h: float, confidence: float | None):
    return rec(
        request_id,
        1,
        at_h,
        "cheap",
        "escalated",
        0.001,
        requested_model="cascade",
        confidence=confidence,
        threshold=-1.0,
    )


def _records():
    day0 = [_auto(f"a{i}", 1 + i, s) for i, s in enumerate((0.2, 0.3, 0.7, 0.8))]
    day0.append(_auto("a0", 1.5, 0.2, attempt=2))  # the same request's second attempt: its score counted once
    day0.append(_auto("s0", 6, 0.9, is_shadow=True))  # a shadow call: not the clients' traffic
    day0 += [_judged(f"c{i}", 7 + i, c) for i, c in enumerate((-0.5, -1.5, None, -0.2))]
    day1 = [_auto(f"b{i}", 25 + i, s) for i, s in enumerate((0.9, 0.9, 0.9, 0.1))]
    return sorted(day0 + day1, key=lambda r: r.started_at)


def _build(drift: DriftReferences | None) -> Report:
    return asyncio.run(build_report(batches_of(_records()), since=DAY0, until=DAY1, drift=drift))


@pytest.fixture(scope="module")
def report() -> Report:
    return _build(DriftReferences.of(THRESHOLDS, psi_alert=0.2, min_samples=4))


def _psi(o: list[float], r: list[float]) -> float:
    return sum((a - b) * math.log(a / b) for a, b in zip(o, r, strict=True))


def test_each_day_and_the_period_against_the_reference(report: Report) -> None:
    by_day = {(r["day"], r["signal"]): r for r in report.tables["drift_by_day"].records()}
    day0, day1 = by_day[(DAY0, "classifier_score")], by_day[(DAY1, "classifier_score")]
    assert day0["answers"] == 4 and day0["psi"] == pytest.approx(0.0)  # two below 0.5, two above: the reference
    assert day1["psi"] == pytest.approx(_psi([0.25, 0.75], [0.5, 0.5]))  # 0.2747
    assert day1["observed_rate"] == 0.75
    totals = {r["signal"]: r for r in report.tables["drift"].records()}
    auto = totals["classifier_score"]
    assert auto["answers"] == 8 and auto["psi"] == pytest.approx(_psi([3 / 8, 5 / 8], [0.5, 0.5]))
    assert auto["observed_rate"] == 5 / 8 and auto["predicted_rate"] == 0.5
    cheap = totals["cascade_confidence"]
    assert (cheap["model"], cheap["answers"], cheap["binned"]) == ("cheap", 4, 3)  # no bin for an answer without
    assert cheap["psi"] is None  # 3 binned confidences: under min_samples
    assert cheap["observed_rate"] == 0.5 and cheap["predicted_rate"] == 0.3  # -1.5 and the one without escalated
    bins = [r for r in report.tables["drift_bins"].records() if r["signal"] == "cascade_confidence"]
    assert [(r["bin_low"], r["bin_high"], r["reference_share"]) for r in bins] == [(None, -1.0, 0.3), (-1.0, None, 0.7)]
    assert [r["observed_share"] for r in bins] == [pytest.approx(1 / 3), pytest.approx(2 / 3)]


def test_the_summary_names_what_passed_the_bound_and_the_page_draws_it(report: Report) -> None:
    drift = report.summary["drift"]
    assert drift["psi_alert"] == 0.2
    assert drift["over_alert"] == []  # over the period: 0.064
    assert drift["days_over_alert"] == [
        {"day": "2026-11-03", "signal": "classifier_score:auto", "psi": pytest.approx(0.274653, abs=1e-6)}
    ]
    assert "fig-drift" in report.figure_ids
    page = report.html()
    assert 'id="fig-drift"' in page and "Data: drift_by_day.csv" in page


def test_without_a_reference_the_section_says_so() -> None:
    assert DriftReferences.of(ThresholdsFile(version=1), psi_alert=0.2, min_samples=4) is None
    report = _build(None)
    assert report.summary["drift"] is None
    assert not report.tables["drift"].rows and "fig-drift" not in report.figure_ids
    assert "the thresholds file has no reference block" in report.html()
