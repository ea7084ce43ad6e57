"""Shadow sampling end to end: a proxy with `auto` (two tiers), a cascade (small → large) and a judge
model, in front of fake upstreams with scripted answers, every request shadowed (`rate: 1`).

The small model answers `A`, the large `B`, the judge `Verdict: TIE`. A multiple-choice prompt is
graded directly (the weak side wrong); an open prompt goes to the judge (a tie). The rows, the
ledger's shadow records, /v1/usage, /metrics, feedback and deletion are read back.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sqlite3
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest

from switchyard.billing.store import open_database
from switchyard.core.settings import Settings
from switchyard.learning.rows import LearningRow, insert_row, labelled_traces, read_rows
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

CHEAP = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
DEAR = {"input_usd_per_mtok": 10.0, "output_usd_per_mtok": 20.0}
JUDGE = {"input_usd_per_mtok": 30.0, "output_usd_per_mtok": 60.0}
ALPHA, BETA, ADMIN = "sk-alpha-0000000000", "sk-beta-00000000000", "admin-key-000000000"
CHOICE_PROMPT = "score=0.2\nWhich planet is largest?\nA. Mars\nB. Jupiter\nC. Venus\nD. Mercury"
ONCE_PROMPT = CHOICE_PROMPT.replace("largest", "the largest of these four")  # sent once, by one test
OPEN_PROMPT = "score=0.5 Write a quiet haiku about the harbour at dawn."


def _score(texts: list[str]) -> np.ndarray:
    return np.array([float(re.search(r"score=([0-9.]+)", t).group(1)) for t in texts])  # type: ignore[union-attr]


def _settings(urls: dict[str, str], database_url: str, **shadow) -> Settings:
    return Settings(
        models=[
            {"name": "m-small", "base_url": urls["small"], "tier": "small", "price": CHEAP},
            {"name": "m-large", "base_url": urls["large"], "tier": "large", "price": DEAR},
            {"name": "m-judge", "base_url": urls["judge"], "price": JUDGE},
        ],
        routing={"auto": {"tiers": ["small", "large"], "thresholds": [0.45], "warm_up": False, "deadline_ms": 10_000}},
        cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": -1.0},
        resilience={"max_attempts": 1},
        upstream={"health_timeout_s": 30},
        billing={"database_url": database_url, "redis_url": "none"},
        auth={"admin_key": ADMIN},
        teams={"alpha": {"api_keys": [ALPHA]}, "beta": {"api_keys": [BETA]}},
        shadow={"rate": 1.0, **shadow},
    )


class Proxy:
    def __init__(self, base: str, app, states: dict[str, FakeState], database_url: str) -> None:
        self.base, self.app, self.states, self.database_url = base, app, states, database_url

    def chat(self, model: str, prompt: str, key: str = ALPHA) -> tuple[str, float]:
        """(request id, time.monotonic() once the whole answer was read)."""
        body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        response = httpx.post(
            self.base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
        )
        assert response.status_code == 200, response.text
        return response.headers["x-request-id"], time.monotonic()

    def rows(self) -> dict[str, LearningRow]:
        return {row.request_id: row for row in _run(self.database_url, read_rows)}

    def labelled_row(self, request_id: str) -> LearningRow:
        assert wait_until(lambda: (r := self.rows().get(request_id)) is not None and r.models, timeout_s=60)
        return self.rows()[request_id]


def _run(url: str, work):
    async def go():
        database = await open_database(url)
        try:
            return await work(database)
        finally:
            await database.aclose()

    return asyncio.run(go())


def _start(stack: ExitStack, tmp: Path, name: str, **shadow) -> Proxy:
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("A",), num_tokens=1)),
        "large": FakeState(behaviour=FakeBehaviour(words=("B",), num_tokens=1)),
        "judge": FakeState(behaviour=FakeBehaviour(words=("Verdict:", "TIE"), num_tokens=2)),
    }
    urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
    database_url = f"sqlite:///{tmp / name}"
    app = create_app(_settings(urls, database_url, **shadow), score_batch=_score)
    return Proxy(stack.enter_context(serve_in_thread(app)), app, states, database_url)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    with ExitStack() as stack:
        yield _start(stack, tmp_path_factory.mktemp("shadow"), "ledger.sqlite3")


class _Ended(logging.Handler):
    """When each request's log line was written: once its response was sent (its `end`)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r'"request_id":\s*"([^"]+)"', record.getMessage())
        if found:
            self.at.setdefault(found.group(1), time.monotonic())


def test_a_multiple_choice_answer_is_graded_directly_after_the_client_has_it(proxy: Proxy) -> None:
    ended = _Ended()
    log = logging.getLogger("switchyard.requests")
    log.addHandler(ended)
    level = log.level
    log.setLevel(logging.INFO)  # setLevel: it clears the logger's cached isEnabledFor
    try:
        request_id, _ = proxy.chat("auto", ONCE_PROMPT)
        row = proxy.labelled_row(request_id)
    finally:
        log.removeHandler(ended)
        log.setLevel(level)
    assert (row.route, row.team, row.label_source) == ("auto", "alpha", "verifiable")
    assert row.models["m-small"]["quality"] == 0.0 and row.models["m-small"]["answered"] is True
    assert row.models["m-large"]["quality"] == 1.0 and row.models["m-large"]["answered"] is False
    assert row.score == pytest.approx(0.2)
    assert row.features is not None and row.features["multiple_choice"] == 1.0
    assert row.prompt is None and len(row.prompt_key) == 64  # store_prompts is off
    # the shadow call reached the large model only once the proxy had sent the whole answer (the
    # request's end, when its log line is written: the fakes run on the same monotonic clock)
    shadow_calls = [r for r in proxy.states["large"].records if "four" in str(r.body)]
    assert len(shadow_calls) == 1 and shadow_calls[0].started_at >= ended.at[request_id]
    # the ledger: the shadow call is a record of the same request, marked, of the same team
    # (both shadow records: the ledger writer may have flushed one before the other)
    assert wait_until(lambda: sum(r.is_shadow for r in read_ledger(proxy.app, request_id=request_id)) == 2)
    records = read_ledger(proxy.app, request_id=request_id)
    shadow = [r for r in records if r.is_shadow]
    # the small model's answer came without logprobs (the client did not ask): it answered once
    # more, whole, with them, for re-tuning the cascade; then the large model
    assert [(r.model, r.team, r.attempt > 1000) for r in shadow] == [
        ("m-small", "alpha", True),
        ("m-large", "alpha", True),
    ]
    assert len(row.models["m-small"]["token_logprobs"]) == 1 and "token_logprobs" not in row.models["m-large"]
    assert [r.model for r in records if not r.is_shadow] == ["m-small"]
    trace = next(t for t in _run(proxy.database_url, labelled_traces) if t.id == request_id)
    assert trace.category == "auto" and trace.extra["label_source"] == "verifiable"
    assert trace.models["m-small"].quality == 0.0 and trace.models["m-large"].cost_usd > 0


def test_a_streamed_answer_is_asked_again_whole_and_graded(proxy: Proxy) -> None:
    prompt = CHOICE_PROMPT.replace("largest", "largest (streamed)")
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    headers = {"authorization": f"Bearer {ALPHA}"}
    with httpx.stream("POST", proxy.base + "/v1/chat/completions", json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    row = proxy.labelled_row(request_id)
    assert (row.route, row.label_source) == ("auto", "verifiable")
    assert {m: o["quality"] for m, o in row.models.items()} == {"m-small": 0.0, "m-large": 1.0}
    assert row.models["m-small"]["answered"] is True
    # the small model streamed to the client, then answered once more, whole, as a shadow call
    assert len([r for r in proxy.states["small"].records if "(streamed)" in str(r.body)]) == 2
    assert wait_until(
        lambda: (
            sorted(r.model for r in read_ledger(proxy.app, request_id=request_id) if r.is_shadow)
            == ["m-large", "m-small"]
        )
    )


def test_an_open_cascade_answer_goes_to_the_judge_and_no_prompt_text_is_stored(proxy: Proxy) -> None:
    request_id, _ = proxy.chat("cascade", OPEN_PROMPT)
    row = proxy.labelled_row(request_id)
    assert (row.route, row.label_source) == ("cascade", "judge")
    assert {m: o["quality"] for m, o in row.models.items()} == {"m-small": 0.5, "m-large": 0.5}
    assert len(proxy.states["judge"].records) >= 2  # asked in both orders
    assert wait_until(
        lambda: (
            {r.model for r in read_ledger(proxy.app, request_id=request_id) if r.is_shadow}
            == {"m-small", "m-large", "m-judge"}
        )
    )
    path = proxy.database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        dump = "\n".join(str(row) for table in tables for row in db.execute(f"SELECT * FROM {table}"))
    assert "haiku" not in dump and "harbour" not in dump


def test_usage_and_metrics_show_shadow_apart(proxy: Proxy) -> None:
    request_id, _ = proxy.chat("auto", CHOICE_PROMPT, key=BETA)
    proxy.labelled_row(request_id)
    # both shadow records (the small model again, with logprobs; the large one) before reading usage
    assert wait_until(lambda: sum(r.is_shadow for r in read_ledger(proxy.app, request_id=request_id)) == 2)
    usage = httpx.get(proxy.base + "/v1/usage", headers={"authorization": f"Bearer {BETA}"}, timeout=30).json()
    records = [r for r in read_ledger(proxy.app) if r.team == "beta"]
    shadow_usd = sum(r.cost_usd for r in records if r.is_shadow)
    team_usd = sum(r.cost_usd for r in records if not r.is_shadow)
    assert shadow_usd > 0
    assert usage["shadow_cost_usd"] == pytest.approx(shadow_usd, abs=1e-6)
    assert usage["cost_usd"] == pytest.approx(team_usd, abs=1e-6)
    metrics = httpx.get(proxy.base + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).text
    sampled = re.search(r'switchyard_shadow_requests_total\{outcome="sampled"\} ([0-9.]+)', metrics)
    labelled = re.search(r'switchyard_shadow_requests_total\{outcome="labelled"\} ([0-9.]+)', metrics)
    assert sampled is not None and float(sampled.group(1)) >= 1
    assert labelled is not None and float(labelled.group(1)) >= 1

    # the judged win rate of the weak side, from the graded pairs (exact values: tests/unit/test_drift.py)
    def weak_win_rate() -> float | None:
        found = re.search(
            r'switchyard_drift_rate\{kind="observed",signal="weak_win_rate"\} ([0-9.]+)',
            httpx.get(proxy.base + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).text,
        )
        return float(found.group(1)) if found else None

    # (compared with the rows only as a range: another test's job may be between its row and its count)
    assert wait_until(lambda: weak_win_rate() is not None)
    assert 0.0 <= (weak_win_rate() or 0.0) <= 1.0


def test_feedback_is_stored_on_the_teams_own_requests_only(proxy: Proxy) -> None:
    request_id, _ = proxy.chat("m-large", "score=0.9 Say hello.")  # not shadowed: a feedback-only row

    def post(body, key: str | None = ALPHA):
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.post(proxy.base + "/v1/feedback", json=body, headers=headers, timeout=30)

    assert post({"request_id": request_id, "score": 0.25}).status_code == 200
    row = proxy.rows()[request_id]
    assert (row.feedback, row.team, list(row.models)) == (0.25, "alpha", ["m-large"])
    trace = next(t for t in _run(proxy.database_url, labelled_traces) if t.id == request_id)
    assert trace.extra["label_source"] == "feedback" and trace.models["m-large"].quality == 0.25
    other = post({"request_id": request_id, "score": 1.0}, key=BETA)
    assert other.status_code == 404 and other.json()["error"]["param"] == "request_id"
    assert post({"request_id": "nope", "score": 1.0}).status_code == 404
    bad = post({"request_id": request_id, "score": 1.5})
    assert bad.status_code == 400 and "error" in bad.json()
    assert post({"request_id": request_id, "score": 1.0}, key=None).status_code == 401
    assert proxy.rows()[request_id].feedback == 0.25


def test_a_teams_rows_are_deleted_by_the_admin(proxy: Proxy) -> None:
    for key in (ALPHA, BETA):
        request_id, _ = proxy.chat("auto", CHOICE_PROMPT, key=key)
        proxy.labelled_row(request_id)
    url = proxy.base + "/admin/learning/rows"
    assert httpx.delete(url, params={"team": "beta"}, timeout=30).status_code == 401
    assert httpx.delete(url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).status_code == 400
    deleted = httpx.delete(url, params={"team": "beta"}, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert deleted.status_code == 200 and deleted.json()["deleted"] >= 1
    rows = proxy.rows()
    assert not any(row.team == "beta" for row in rows.values())
    assert any(row.team == "alpha" for row in rows.values())


def test_a_spent_budget_stops_shadowing_and_old_rows_are_pruned(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'budget.sqlite3'}"
    old = LearningRow("old-request", time.time() - 40 * 86_400, "alpha", "auto", "k" * 64, {"m-small": {}})

    async def seed(database):
        await insert_row(database, old)

    _run(database_url, seed)
    with ExitStack() as stack:
        states = {n: FakeState() for n in ("small", "large", "judge")}
        urls = {n: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for n, s in states.items()}
        app = create_app(_settings(urls, database_url, budget_usd_per_day=0.0), score_batch=_score)
        base = stack.enter_context(serve_in_thread(app))
        proxy = Proxy(base, app, states, database_url)
        assert wait_until(lambda: "old-request" not in proxy.rows())  # retention_days: 30
        proxy.chat("auto", CHOICE_PROMPT)
        pattern = re.compile(r'switchyard_shadow_requests_total\{outcome="over_budget"\} ([0-9.]+)')

        def over_budget() -> bool:
            found = pattern.search(
                httpx.get(base + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).text
            )
            return found is not None and float(found.group(1)) >= 1

        assert wait_until(over_budget)
        assert states["large"].num_requests == 0 and proxy.rows() == {}
