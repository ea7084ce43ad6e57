"""Billing in one proxy process (no Valkey): reservations under concurrency, the ledger's own keys,
keys and teams at run time through the admin API, /v1/usage, and the cost on each answer."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

ADMIN = {"authorization": "Bearer sk-admin-local"}
PRICE_OUT = 200.0  # 5 answer tokens cost $0.001; the prompt is free


@pytest.fixture
def upstream() -> Iterator[tuple[str, FakeState]]:
    state = FakeState(behaviour=FakeBehaviour(latency_s=0.05))
    with serve_in_thread(FakeOpenAIUpstream(state)) as url:
        yield url + "/v1", state


@contextmanager
def proxy(upstream_url: str, tmp_path, teams: dict | None = None, **billing) -> Iterator[tuple[str, object]]:
    settings = Settings(
        models=[
            {
                "name": "priced",
                "base_url": upstream_url,
                "price": {"input_usd_per_mtok": 0, "output_usd_per_mtok": PRICE_OUT},
            },
        ],
        teams=teams or {},
        auth={"admin_key": "sk-admin-local"},
        billing={"database_url": f"sqlite:///{tmp_path / 'usage.db'}", "spill_path": tmp_path / "spill.jsonl"}
        | billing,
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        yield url, app


def _body(content: str = "hi", **extra) -> dict:
    return {"model": "priced", "messages": [{"role": "user", "content": content}], "max_tokens": 5, **extra}


async def _concurrently(url: str, key: str, n: int, stream: bool = False) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=n)) as client:
        return await asyncio.gather(
            *(
                client.post(url + "/v1/chat/completions", json=_body(stream=stream), headers={"authorization": key})
                for _ in range(n)
            )
        )


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_200_concurrent_requests_do_not_spend_20_times_the_budget(upstream, tmp_path, stream):
    """On main before reservations: all 200 answered, $0.20 spent against a $0.01 budget."""
    url_up, _ = upstream
    teams = {"t": {"api_keys": ["sk-t"], "budget_usd_per_day": 0.01}}
    with proxy(url_up, tmp_path, teams) as (url, app):
        responses = asyncio.run(_concurrently(url, "Bearer sk-t", 200, stream))
        statuses = Counter(r.status_code for r in responses)
        assert 9 <= statuses[200] <= 10, statuses  # each reserved its $0.001: at most ten fit
        assert statuses[429] == 200 - statuses[200]
        # every request once in the ledger: each answer's attempt, each refusal's record (of no cost)
        assert wait_until(lambda: len(read_ledger(app)) == 200, timeout_s=30)
        assert Counter(r.status for r in read_ledger(app)) == {"completed": statuses[200], "refused": statuses[429]}
    spent = sum(r.cost_usd for r in read_ledger(f"sqlite:///{tmp_path / 'usage.db'}"))
    assert spent <= 0.01 + 1e-9


def test_the_ledger_keys_on_the_proxys_own_id_and_keeps_the_clients_for_correlation(upstream, tmp_path):
    """On main: 20 requests with one x-request-id left one row, and team B's replaced team A's."""
    url_up, _ = upstream
    teams = {"a": {"api_keys": ["sk-a"]}, "b": {"api_keys": ["sk-b"]}}
    with proxy(url_up, tmp_path, teams) as (url, app):
        ids = set()
        for key in ["sk-a"] + ["sk-b"] * 19:
            response = httpx.post(
                url + "/v1/chat/completions",
                json=_body(),
                headers={"authorization": f"Bearer {key}", "x-request-id": "same-id"},
            )
            assert response.status_code == 200
            assert response.headers["x-client-request-id"] == "same-id"
            ids.add(response.headers["x-request-id"])
        assert len(ids) == 20 and all(i.startswith("req_") for i in ids)
        assert wait_until(lambda: len(read_ledger(app, client_request_id="same-id")) == 20, timeout_s=30)
        records = read_ledger(app, client_request_id="same-id")
    assert Counter(r.team for r in records) == {"a": 1, "b": 19}
    assert {r.request_id for r in records} == ids


def test_cost_header_and_the_streams_usage_cost(upstream, tmp_path):
    url_up, _ = upstream
    with proxy(url_up, tmp_path) as (url, _):
        answer = httpx.post(url + "/v1/chat/completions", json=_body())
        with httpx.stream(
            "POST",
            url + "/v1/chat/completions",
            json=_body(stream=True, stream_options={"include_usage": True}),
        ) as streamed:
            chunks = [line for line in streamed.iter_lines() if line.startswith("data: {")]
    assert float(answer.headers["x-switchyard-cost-usd"]) == pytest.approx(0.001)
    usage = httpx.Response(200, content=chunks[-1][len("data: ") :]).json()["usage"]
    assert usage["cost_usd"] == pytest.approx(0.001) and usage["completion_tokens"] == 5


def test_the_admin_api_manages_teams_and_keys_that_work_at_once(upstream, tmp_path):
    url_up, _ = upstream
    with proxy(url_up, tmp_path, {"yaml-team": {"api_keys": ["sk-yaml"]}}) as (url, _):
        assert httpx.get(url + "/admin/teams").status_code == 401
        assert httpx.get(url + "/admin/teams", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.delete(url + "/admin/nothing/here").status_code == 401
        assert httpx.request("OPTIONS", url + "/admin/teams").status_code == 401
        assert httpx.get(url + "/admin").status_code == 401
        too_far = httpx.post(url + "/admin/keys", headers=ADMIN, json={"team": "ml", "expires_in_days": 1e300})
        assert too_far.status_code == 400 and too_far.json()["error"]["param"] == "expires_in_days"
        too_rich = httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "z", "budget_usd_per_day": 1e300})
        assert too_rich.status_code == 400
        assert httpx.get(url + "/admin/nothing", headers=ADMIN).status_code == 404

        created = httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "ml", "rpm": 100, "models": ["priced"]})
        assert created.status_code == 201, created.text
        assert created.json()["source"] == "database"
        again = httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "ml"})
        assert again.status_code == 409
        yaml = httpx.patch(url + "/admin/teams/yaml-team", headers=ADMIN, json={"rpm": 1})
        assert yaml.status_code == 409 and "YAML" in yaml.json()["error"]["message"]
        unknown_model = httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "x", "models": ["nope"]})
        assert unknown_model.status_code == 400
        typo = httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "y", "budget": 3})
        assert typo.status_code == 400 and typo.json()["error"]["param"] == "budget"

        key = httpx.post(url + "/admin/keys", headers=ADMIN, json={"team": "ml", "budget_usd_per_day": 1})
        assert key.status_code == 201, key.text
        secret, key_id = key.json()["key"], key.json()["id"]
        assert secret.startswith("sk-") and key_id.startswith("key_")
        bearer = {"authorization": f"Bearer {secret}"}
        assert httpx.post(url + "/v1/chat/completions", json=_body(), headers=bearer).status_code == 200
        listed = httpx.get(url + "/admin/keys", headers=ADMIN, params={"team": "ml"}).json()["data"]
        assert [k["id"] for k in listed] == [key_id] and "key" not in listed[0]
        assert listed[0]["prefix"].startswith(secret[:8])

        revoked = httpx.delete(url + f"/admin/keys/{key_id}", headers=ADMIN)
        assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
        refused = httpx.post(url + "/v1/chat/completions", json=_body(), headers=bearer)
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
        assert httpx.delete(url + "/admin/keys/key_nope", headers=ADMIN).status_code == 404

        teams = {t["name"]: t["source"] for t in httpx.get(url + "/admin/teams", headers=ADMIN).json()["data"]}
        assert teams == {"yaml-team": "yaml", "ml": "database"}


def test_usage_is_a_teams_own_and_the_admins_for_any_team(upstream, tmp_path):
    url_up, _ = upstream
    teams = {"a": {"api_keys": ["sk-a"]}, "b": {"api_keys": ["sk-b"]}}
    with proxy(url_up, tmp_path, teams) as (url, app):
        for key in ("sk-a", "sk-a", "sk-b"):
            httpx.post(url + "/v1/chat/completions", json=_body(), headers={"authorization": f"Bearer {key}"})
        assert wait_until(lambda: len(read_ledger(app)) == 3, timeout_s=30)
        as_a = {"authorization": "Bearer sk-a"}
        own = httpx.get(url + "/v1/usage", headers=as_a, params={"group_by": "day"})
        other = httpx.get(url + "/v1/usage", headers=as_a, params={"team": "b"})
        bad = httpx.get(url + "/v1/usage", headers=as_a, params={"group_by": "week"})
        every = httpx.get(url + "/v1/usage", headers=ADMIN)
        typo = httpx.get(url + "/admin/usage", headers=ADMIN, params={"team": "bb"})
        nobody = httpx.get(url + "/v1/usage")
    assert own.status_code == 200, own.text
    body = own.json()
    assert (body["team"], body["requests"], body["completion_tokens"]) == ("a", 2, 10)
    assert body["cost_usd"] == pytest.approx(0.002)
    assert len(body["data"]) == 1 and body["data"][0]["requests"] == 2
    assert other.status_code == 403 and other.json()["error"]["code"] == "permission_denied"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"
    assert every.json()["requests"] == 3
    assert typo.status_code == 404 and typo.json()["error"]["param"] == "team"
    assert nobody.status_code == 401


def test_priority_tier_caps_and_rate_limit_headers(upstream, tmp_path):
    url_up, state = upstream
    teams = {"etl": {"api_keys": ["sk-etl"], "priority": "nightly", "rpm": 3}}
    tiers = {"nightly": {"saturation": "best-effort", "max_tokens": 10, "max_concurrency": 1}}
    with proxy(url_up, tmp_path, teams, priority_tiers=tiers) as (url, _):
        headers = {"authorization": "Bearer sk-etl"}
        too_long = httpx.post(url + "/v1/chat/completions", json=_body(max_tokens=11), headers=headers)
        unset = {"model": "priced", "messages": [{"role": "user", "content": "hi"}]}
        capped = httpx.post(url + "/v1/chat/completions", json=unset, headers=headers)
        answers = [httpx.post(url + "/v1/chat/completions", json=_body(), headers=headers) for _ in range(4)]
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    assert capped.status_code == 200 and state.records[0].body["max_tokens"] == 10  # the tier's cap, sent upstream
    assert [a.status_code for a in answers[:2]] == [200, 200]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "3"
    assert int(answers[1].headers["x-ratelimit-remaining-requests"]) <= 1
    assert answers[-1].status_code == 429 and answers[-1].json()["error"]["code"] == "rate_limit_exceeded"
    assert "retry-after" in answers[-1].headers


def test_valkey_down_fails_closed_for_budgets_then_recovers_without_a_restart(upstream, tmp_path, valkey):
    url_up, _ = upstream
    teams = {"metered": {"api_keys": ["sk-metered"], "budget_usd_per_day": 1}, "free": {"api_keys": ["sk-free"]}}
    with proxy(url_up, tmp_path, teams, redis_url=valkey.url) as (url, _):
        metered, free = {"authorization": "Bearer sk-metered"}, {"authorization": "Bearer sk-free"}
        assert httpx.post(url + "/v1/chat/completions", json=_body(), headers=metered).status_code == 200
        with valkey.stopped():
            refused = httpx.post(url + "/v1/chat/completions", json=_body(), headers=metered)
            unlimited = httpx.post(url + "/v1/chat/completions", json=_body(), headers=free)
        back = httpx.post(url + "/v1/chat/completions", json=_body(), headers=metered)
    assert refused.status_code == 503, refused.text
    assert "fail_open" in refused.json()["error"]["message"]
    assert unlimited.status_code == 200  # no budget, no limit: Valkey is not asked
    assert back.status_code == 200


def test_valkey_down_with_fail_open_lets_requests_through(upstream, tmp_path, valkey):
    url_up, _ = upstream
    teams = {"metered": {"api_keys": ["sk-metered"], "budget_usd_per_day": 1, "rpm": 100}}
    with proxy(url_up, tmp_path, teams, redis_url=valkey.url, fail_open=True) as (url, app):
        with valkey.stopped():
            answered = httpx.post(
                url + "/v1/chat/completions", json=_body(), headers={"authorization": "Bearer sk-metered"}
            )
        assert answered.status_code == 200
        assert wait_until(lambda: len(read_ledger(app)) == 1, timeout_s=30)  # the ledger still has it


@pytest.mark.slow
def test_the_report_from_the_cli_and_from_the_admin_api(upstream, tmp_path):
    import json
    import os
    import subprocess
    import sys

    url_up, _ = upstream
    with proxy(url_up, tmp_path, {"a": {"api_keys": ["sk-a"]}}) as (url, app):
        for _ in range(3):
            httpx.post(url + "/v1/chat/completions", json=_body(), headers={"authorization": "Bearer sk-a"})
        assert wait_until(lambda: len(read_ledger(app)) == 3, timeout_s=30)
        page = httpx.get(url + "/admin/report", headers=ADMIN, params={"team": "a"}, timeout=60)
        refused = httpx.get(url + "/admin/report", headers={"authorization": "Bearer sk-a"})
        bad_day = httpx.get(url + "/admin/report", headers=ADMIN, params={"since": "yesterday"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<svg" in page.text and "http://" not in page.text.split("<svg", 1)[0]
    assert refused.status_code == 401
    assert bad_day.status_code == 400 and bad_day.json()["error"]["param"] == "since"

    config = tmp_path / "report.yaml"
    config.write_text(f"billing:\n  database_url: sqlite:///{tmp_path / 'usage.db'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "switchyard", "report", "--config", str(config), "--team", "a", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 3 and summary["cost_usd"] == pytest.approx(0.003)
    assert (out / "report.html").read_text().count("<figure") >= 5
    assert str(out / "report.html") in result.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "switchyard", "report", "--config", str(config), "--since", "nope", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert wrong.returncode != 0 and "--since must be a date" in wrong.stderr


def test_the_first_team_created_at_run_time_closes_an_open_proxy(upstream, tmp_path):
    url_up, _ = upstream
    with proxy(url_up, tmp_path) as (url, _):
        assert httpx.post(url + "/v1/chat/completions", json=_body()).status_code == 200  # open: no team
        assert httpx.post(url + "/admin/teams", headers=ADMIN, json={"name": "first"}).status_code == 201
        closed = httpx.post(url + "/v1/chat/completions", json=_body())
        key = httpx.post(url + "/admin/keys", headers=ADMIN, json={"team": "first", "expires_in_days": 1}).json()
        keyed = httpx.post(
            url + "/v1/chat/completions", json=_body(), headers={"authorization": f"Bearer {key['key']}"}
        )
    assert closed.status_code == 401 and closed.json()["error"]["code"] == "invalid_api_key"
    assert keyed.status_code == 200
    assert key["expires_at"] is not None and key["status"] == "active"
