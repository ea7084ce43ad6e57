"""Routing versions through the proxy: the version that routed each auto and cascade request (header,
ledger, /v1/models, metrics), `POST /admin/reload` changing it without a restart (a bad file keeps
the old one), a request under way finishing on the version it started with, a rollout's candidate
answering its share of requests by the hash of their ids, and `switchyard rollout promote` /
`rollback` on the files, then asking the proxy to reload.

The proxy runs in this process on 127.0.0.1 in front of two fake OpenAI upstreams; the classifier
is replaced by a scorer that reads the score out of the prompt, so every route is known in advance.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner, Result

from switchyard.cli import app
from switchyard.core.settings import Settings
from switchyard.gateway.routings import is_in_share
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_for_records, wait_until

ADMIN = {"authorization": "Bearer admin-secret"}
runner = CliRunner()


def _thresholds(threshold: float, cascade_threshold: float = -5.0) -> str:
    return (
        f"version: 1\nrouting:\n  router: classifier\n  threshold: {threshold}\n"
        f"cascade:\n  rungs:\n    m-small:\n      scorer: {{kind: feature, feature: mean_logprob}}\n"
        f"      threshold: {cascade_threshold}\n"
    )


def _score_batch(texts: list[str]) -> np.ndarray:
    return np.array([float(t.rsplit("=", 1)[-1]) for t in texts])


@dataclass
class Proxy:
    url: str
    app: object
    thresholds: Path
    candidate: Path
    states: dict[str, FakeState]


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[dict[str, str], dict[str, FakeState]]]:
    states = {tier: FakeState(behaviour=FakeBehaviour(words=(tier,))) for tier in ("small", "large")}
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        yield urls, states


def _proxy(tmp: Path, upstreams, *, share: float = 0.0) -> Iterator[Proxy]:
    urls, states = upstreams
    thresholds, candidate = tmp / "thresholds.yaml", tmp / "candidate.yaml"
    thresholds.write_text(_thresholds(0.45))
    settings = Settings(
        models=[{"name": f"m-{tier}", "base_url": url, "tier": tier} for tier, url in urls.items()],
        routing={
            "thresholds_file": thresholds,
            "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
        },
        cascade={"ladder": ["m-small", "m-large"]},
        rollout={"candidate": candidate, "share": share},
        auth={"admin_key": "admin-secret"},
        billing={"ledger_path": tmp / "ledger.sqlite3", "spill_path": tmp / "spill.jsonl"},
        upstream={"health_timeout_s": 30},
    )
    app = create_app(settings, score_batch=_score_batch)
    with serve_in_thread(app) as url:
        yield Proxy(url, app, thresholds, candidate, states)


@pytest.fixture
def proxy(tmp_path, upstreams) -> Iterator[Proxy]:
    yield from _proxy(tmp_path, upstreams)


@pytest.fixture
def rollout_proxy(tmp_path, upstreams) -> Iterator[Proxy]:
    yield from _proxy(tmp_path, upstreams, share=0.5)


def _auto(client: httpx.Client, score: float, **headers: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"score={score}"}], "max_tokens": 5}
    response = client.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def _version(response: httpx.Response) -> str:
    return response.headers["x-switchyard-routing-version"]


def test_reload_changes_routing_and_version_without_restart(proxy):
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        before = _auto(client, 0.5)
        assert before.headers["x-switchyard-model"] == "m-large"  # 0.5 >= 0.45
        old = _version(before)
        assert old.startswith("v-") and len(old) == 14
        proxy.thresholds.write_text(_thresholds(0.6))
        reloaded = client.post("/admin/reload", headers=ADMIN)
        assert reloaded.status_code == 200, reloaded.text
        body = reloaded.json()
        assert body["changed"] is True and body["previous"]["current"]["version"] == old
        new = body["current"]["version"]
        assert new != old and body["current"]["thresholds_file"] == str(proxy.thresholds)
        after = _auto(client, 0.5)
        assert after.headers["x-switchyard-model"] == "m-small"  # 0.5 < 0.6
        assert _version(after) == new
        cascade = client.post(
            "/v1/chat/completions", json={"model": "cascade", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert _version(cascade) == new
        explicit = client.post(
            "/v1/chat/completions", json={"model": "m-small", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert "x-switchyard-routing-version" not in explicit.headers
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
        assert cards["auto"]["routing_versions"] == {"current": new}
        assert cards["cascade"]["routing_versions"] == {"current": new}
        again = client.post("/admin/reload", headers=ADMIN).json()  # nothing changed on disk
        assert again["changed"] is False and again["current"]["version"] == new
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics", headers=ADMIN).text)}
    samples = families["switchyard_routing_version_info"].samples
    info = {(s.labels["version"], s.labels["role"]): s.value for s in samples}
    assert info == {(old, "current"): 0.0, (new, "current"): 1.0}
    counted = {
        (s.labels["version"], s.labels["outcome"]): s.value
        for s in families["switchyard_routing_version_requests"].samples
        if s.name.endswith("_total")
    }
    assert counted[(old, "accepted")] == 1 and counted[(new, "accepted")] == 2
    records = wait_for_records(proxy.app, 1, request_id=after.headers["x-request-id"])
    assert [r.routing_version for r in records] == [new]
    assert wait_for_records(proxy.app, 1, request_id=before.headers["x-request-id"])[0].routing_version == old


def test_a_bad_file_keeps_the_old_version_and_says_why(proxy):
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        old = _version(_auto(client, 0.5))
        proxy.thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  thresholds: [0.9, 0.1]\n")
        refused = client.post("/admin/reload", headers=ADMIN)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "reload_refused" and error["type"] == "invalid_request_error"
        assert old in error["message"] and "ascending" in error["message"]
        proxy.thresholds.write_text("not: [yaml")
        assert "not valid YAML" in client.post("/admin/reload", headers=ADMIN).json()["error"]["message"]
        still = _auto(client, 0.5)
        assert _version(still) == old and still.headers["x-switchyard-model"] == "m-large"
        assert client.get("/admin/routing", headers=ADMIN).json()["current"]["version"] == old
        assert client.post("/admin/reload").status_code == 401  # the admin key first


def test_a_request_under_way_finishes_on_the_version_it_started_with(proxy):
    gate = threading.Event()
    large = proxy.states["large"]
    large.behaviour = FakeBehaviour(words=("large",), wait_for=gate)
    large.arrived.clear()
    try:
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            held: list[httpx.Response] = []
            asking = threading.Thread(target=lambda: held.append(_auto(client, 0.5)))
            asking.start()
            assert large.arrived.wait(30)  # routed by 0.45 to large, and waiting there
            old = client.get("/admin/routing", headers=ADMIN).json()["current"]["version"]
            proxy.thresholds.write_text(_thresholds(0.6))
            new = client.post("/admin/reload", headers=ADMIN).json()["current"]["version"]
            gate.set()
            asking.join(30)
    finally:
        large.behaviour = FakeBehaviour(words=("large",))
    (response,) = held
    assert new != old
    assert _version(response) == old and response.headers["x-switchyard-model"] == "m-large"
    assert wait_for_records(proxy.app, 1, request_id=response.headers["x-request-id"])[0].routing_version == old


def test_a_rollout_splits_by_request_id_and_both_versions_reach_the_ledger(rollout_proxy):
    proxy = rollout_proxy
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        current = _version(_auto(client, 0.5))
        assert client.get("/admin/routing", headers=ADMIN).json()["candidate"] is None  # no candidate file yet
        proxy.candidate.write_text(_thresholds(0.9))
        body = client.post("/admin/reload", headers=ADMIN).json()
        assert body["current"]["version"] == current
        candidate = body["candidate"]["version"]
        assert candidate != current and body["candidate"]["share"] == 0.5
        responses = [_auto(client, 0.5) for _ in range(24)]
        card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "auto")
    assert card["routing_versions"] == {"current": current, "candidate": candidate}
    assert card["rollout_share"] == 0.5
    by_version: dict[str, set[str]] = {}
    for response in responses:
        request_id = response.headers["x-request-id"]
        expected = candidate if is_in_share(request_id, 0.5) else current
        assert _version(response) == expected
        by_version.setdefault(expected, set()).add(response.headers["x-switchyard-model"])
    # the candidate's 0.9 sends 0.5 to small, the current's 0.45 to large: both halves seen
    assert by_version == {candidate: {"m-small"}, current: {"m-large"}}
    ids = {r.headers["x-request-id"]: _version(r) for r in responses}

    def recorded() -> dict[str, str | None]:
        return {r.request_id: r.routing_version for r in read_ledger(proxy.app) if r.request_id in ids}

    assert wait_until(lambda: len(recorded()) == len(ids))
    assert recorded() == ids


def test_is_in_share_is_deterministic_and_near_the_share():
    ids = [f"req-{i}" for i in range(4000)]
    inside = [i for i in ids if is_in_share(i, 0.1)]
    assert inside == [i for i in ids if is_in_share(i, 0.1)]
    assert 300 < len(inside) < 500
    assert not any(is_in_share(i, 0.0) for i in ids) and all(is_in_share(i, 1.0) for i in ids)
    assert set(inside) <= {i for i in ids if is_in_share(i, 0.3)}  # a larger share keeps the smaller's


def _cli_config(tmp: Path, proxy: Proxy, name: str = "switchyard.yaml", **rollout: str) -> Path:
    config = tmp / name
    extra = "".join(f"  {key}: {value}\n" for key, value in rollout.items())
    config.write_text(
        "models:\n"
        "  - {name: m-small, base_url: 'http://127.0.0.1:9/v1', tier: small}\n"
        "  - {name: m-large, base_url: 'http://127.0.0.1:9/v1', tier: large}\n"
        f"routing:\n  thresholds_file: {proxy.thresholds}\n  auto: {{tiers: [small, large]}}\n"
        f"rollout:\n  candidate: {proxy.candidate}\n  share: 0.5\n{extra}"
    )
    return config


def _rollout(*args: str) -> Result:
    return runner.invoke(app, ["rollout", *args])


def test_promote_and_rollback_change_the_files_and_reload_the_proxy(rollout_proxy, tmp_path, monkeypatch):
    proxy = rollout_proxy
    config = str(_cli_config(tmp_path, proxy))
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", "admin-secret")
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        first = _version(_auto(client, 0.5))
        proxy.candidate.write_text(_thresholds(0.9))
        candidate = client.post("/admin/reload", headers=ADMIN).json()["candidate"]["version"]

        promoted = _rollout("promote", "--config", config, "--url", proxy.url)
        assert promoted.exit_code == 0, promoted.output
        assert f"reloaded: routing by {candidate}" in promoted.output
        assert not proxy.candidate.exists() and "0.9" in proxy.thresholds.read_text()
        assert "0.45" in Path(f"{proxy.thresholds}.previous").read_text()
        routing = client.get("/admin/routing", headers=ADMIN).json()
        assert routing["current"]["version"] == candidate and routing["candidate"] is None
        after = [_auto(client, 0.5) for _ in range(4)]  # no share left: every request on the promoted version
        assert {(_version(r), r.headers["x-switchyard-model"]) for r in after} == {(candidate, "m-small")}

        rolled = _rollout("rollback", "--config", config, "--url", proxy.url)
        assert rolled.exit_code == 0, rolled.output
        assert f"reloaded: routing by {first}" in rolled.output
        assert "0.45" in proxy.thresholds.read_text()
        assert "0.9" in Path(f"{proxy.thresholds}.rolled-back").read_text()
        assert _auto(client, 0.5).headers["x-switchyard-model"] == "m-large"
        again = _rollout("rollback", "--config", config)
        assert again.exit_code == 2 and "nothing to roll back" in again.output

        proxy.candidate.write_text(_thresholds(0.7))  # a new candidate, withdrawn before promotion
        assert client.post("/admin/reload", headers=ADMIN).json()["candidate"] is not None
        withdrawn = _rollout("rollback", "--config", config, "--url", proxy.url)
        assert withdrawn.exit_code == 0 and "withdrew the candidate" in withdrawn.output
        assert Path(f"{proxy.candidate}.withdrawn").exists() and not proxy.candidate.exists()
        assert client.get("/admin/routing", headers=ADMIN).json()["candidate"] is None
        wrong = _rollout("promote", "--config", config, "--url", proxy.url, "--admin-key", "nope")
        assert wrong.exit_code == 2 and "nothing to promote" in wrong.output  # the files are checked first


def test_promote_refuses_what_it_cannot_do_and_leaves_the_files(tmp_path):
    thresholds, candidate = tmp_path / "thresholds.yaml", tmp_path / "candidate.yaml"
    thresholds.write_text(_thresholds(0.45))
    proxy = Proxy("", None, thresholds, candidate, {})
    config = str(_cli_config(tmp_path, proxy))
    missing = _rollout("promote", "--config", config)
    assert missing.exit_code == 2 and f"rollout.candidate {candidate} does not exist" in missing.output
    candidate.write_text("version: 1\nrouting:\n  router: classifier\n  thresholds: [0.9, 0.1]\n")
    bad = _rollout("promote", "--config", config)
    assert bad.exit_code == 2 and "cannot be promoted" in bad.output and "ascending" in bad.output
    assert candidate.exists() and "0.45" in thresholds.read_text()  # nothing moved
    with_artifact = _cli_config(tmp_path, proxy, "artifact.yaml", candidate_artifact=str(tmp_path))
    no_artifact = _rollout("promote", "--config", str(with_artifact))
    assert no_artifact.exit_code == 2 and "routing.auto.classifier_artifact" in no_artifact.output
    (tmp_path / "bare.yaml").write_text("models: []\n")
    none = _rollout("promote", "--config", str(tmp_path / "bare.yaml"))
    assert none.exit_code == 2 and "routing.thresholds_file is not set" in none.output
    candidate.write_text(_thresholds(0.7))
    unreachable = _rollout("promote", "--config", config, "--url", "http://127.0.0.1:9", "--admin-key", "k")
    assert unreachable.exit_code == 2 and "could not be asked to reload" in unreachable.output
    assert "0.7" in thresholds.read_text()  # the files were changed before the proxy was asked
