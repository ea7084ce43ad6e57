"""Teams through the proxy and the `openai` SDK: keys, the models a team may use, daily budgets."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack, contextmanager

import httpx
import numpy as np
import openai
import pytest

from switchyard.backends.defaults import load_settings
from switchyard.core.settings import ConfigError, Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

# The fake counts len(json(messages)) // 4 prompt tokens and answers 5 tokens. At these prices a
# call to m-large costs $0.015 for the prompt "score=0.62" ($0.008 estimated before the call).
PRICES = {"m-small": 1.0, "m-large": 1000.0}


def cost_usd(model: str, content: str) -> float:
    return (len(f'[{{"role":"user","content":"{content}"}}]') // 4 + 5) * PRICES[model] / 1e6


TEAMS = {
    "search": {"api_keys": ["sk-search"], "models": ["m-small"]},
    "research": {"api_keys": ["sk-research", "sk-research-2"], "budget_usd_per_day": 0.02},
}


@pytest.fixture
def upstreams():
    states = {tier: FakeState(behaviour=FakeBehaviour(words=(tier,))) for tier in ("small", "large")}
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        yield urls, states


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    path = tmp_path / "usage.db"
    monkeypatch.setenv("SWITCHYARD__BILLING__LEDGER_PATH", str(path))  # this test's own ledger
    return path


@contextmanager
def proxy(urls, tmp_path, fallbacks=None):
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  threshold: 0.45\n")
    models = [
        {
            "name": f"m-{tier}",
            "base_url": url,
            "tier": tier,
            "price": {"input_usd_per_mtok": PRICES[f"m-{tier}"], "output_usd_per_mtok": PRICES[f"m-{tier}"]},
            "fallbacks": (fallbacks or {}).get(f"m-{tier}", []),
        }
        for tier, url in urls.items()
    ]
    settings = Settings(
        models=models,
        teams=TEAMS,
        routing={
            "thresholds_file": thresholds,
            "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000},
        },
        upstream={"health_timeout_s": 30},  # a probe late on a busy machine must not take a tier out of the routes
    )
    app = create_app(settings, score_batch=lambda texts: np.array([float(t.split("=")[-1]) for t in texts]))
    with serve_in_thread(app) as url:
        yield url + "/v1", app


def _auto(sdk, score: float, **kwargs):
    return sdk.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": f"score={score}"}], max_tokens=5, **kwargs
    )


def _sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def test_a_key_no_team_holds_is_refused_with_openais_error(upstreams, tmp_path, ledger_path):
    urls, states = upstreams
    with proxy(urls, tmp_path) as (url, _):
        with _sdk(url, "sk-nobody") as sdk, pytest.raises(openai.AuthenticationError) as caught:
            sdk.chat.completions.create(model="m-small", messages=[{"role": "user", "content": "hi"}])
        no_key = httpx.post(url + "/chat/completions", json={"model": "m-small", "messages": []})
        models = httpx.get(url + "/models")
    assert caught.value.status_code == 401
    assert caught.value.body == {
        "message": "Incorrect API key: no team holds it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert no_key.status_code == 401 and "Authorization: Bearer" in no_key.json()["error"]["message"]
    assert models.status_code == 401
    assert not states["small"].records  # nothing reached an upstream


def test_a_team_uses_only_its_models_explicitly_and_through_auto(upstreams, tmp_path, ledger_path):
    urls, states = upstreams
    with proxy(urls, tmp_path) as (url, _), _sdk(url, "sk-search") as sdk:
        with pytest.raises(openai.PermissionDeniedError) as caught:
            sdk.chat.completions.create(model="m-large", messages=[{"role": "user", "content": "hi"}])
        assert [m.id for m in sdk.models.list()] == ["m-small", "auto"]  # auto: it may route to m-small
        routed = _auto(sdk, 0.62)
        with sdk.chat.completions.with_streaming_response.create(
            model="auto", messages=[{"role": "user", "content": "score=0.9"}], stream=True
        ) as streamed:
            stream_headers = streamed.headers
            text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
        with _sdk(url, "sk-research") as other:  # no model list: every model
            assert [m.id for m in other.models.list()] == ["m-small", "m-large", "auto"]
    assert caught.value.status_code == 403 and caught.value.body["code"] == "model_not_allowed"
    assert caught.value.body["message"] == "Team 'search' may not use model 'm-large'."
    assert routed.headers["x-switchyard-model"] == "m-small"
    assert routed.headers["x-switchyard-route"] == "auto:classifier=0.620>=0.450->small(large not allowed)"
    assert stream_headers["x-switchyard-route"] == "auto:classifier=0.900>=0.450->small(large not allowed)"
    assert text.startswith("small")
    assert not states["large"].records


def test_fallbacks_stay_within_the_teams_models(upstreams, tmp_path, ledger_path):
    urls, states = upstreams
    states["small"].behaviour = FakeBehaviour(failure="500")
    with proxy(urls, tmp_path, fallbacks={"m-small": ["m-large"]}) as (url, _):
        with _sdk(url, "sk-search") as sdk, pytest.raises(openai.APIStatusError) as caught:
            sdk.chat.completions.create(model="m-small", messages=[{"role": "user", "content": "hi"}])
        with _sdk(url, "sk-research") as sdk:
            answer = sdk.chat.completions.with_raw_response.create(
                model="m-small", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
            # 256 answer tokens on m-large ($0.26) do not fit research's $0.02: the fallback is not tried
            with pytest.raises(openai.APIStatusError) as unaffordable:
                sdk.chat.completions.create(model="m-small", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code >= 500  # m-small failed and its fallback was not the team's to use
    assert answer.headers["x-switchyard-model"] == "m-large"  # research may use the fallback
    assert "m-large: 429 its worst-case cost does not fit the budget" in unaffordable.value.body["message"]
    assert len(states["large"].records) == 1


def _spent(app, team: str) -> float:
    return sum(r.cost_usd for r in read_ledger(app) if r.team == team)


def test_budget_headroom_routes_down_reserves_then_refuses_and_a_restart_remembers(upstreams, tmp_path, ledger_path):
    urls, states = upstreams
    with proxy(urls, tmp_path) as (url, app), _sdk(url, "sk-research") as sdk:
        first = _auto(sdk, 0.62)  # $0.008 reserved on m-large fits $0.02; it costs $0.015
        second = _auto(sdk, 0.62)  # $0.005 left: the estimate does not fit, m-small answers
        with pytest.raises(openai.RateLimitError) as too_big:  # explicit names are never moved: refused
            sdk.chat.completions.create(
                model="m-large", messages=[{"role": "user", "content": "score=0.62"}], max_tokens=5
            )
        # $0.004 reserved fits; the answer costs $0.015: a reservation bounds a request only by its estimate
        last = sdk.chat.completions.create(
            model="m-large", messages=[{"role": "user", "content": "score=0.62"}], max_tokens=1
        )
        with pytest.raises(openai.RateLimitError) as refused:
            _auto(sdk, 0.1)
        research = lambda: sorted(r.status for r in read_ledger(app) if r.team == "research")  # noqa: E731
        # three answers, and the two refusals (a refused request is one record, of no cost)
        assert wait_until(lambda: research() == ["completed"] * 3 + ["refused"] * 2, timeout_s=30), research()
        spent = _spent(app, "research")
        with _sdk(url, "sk-search") as search:  # other teams are not affected
            assert search.chat.completions.create(model="m-small", messages=[{"role": "user", "content": "hi"}])
    assert first.headers["x-switchyard-model"] == "m-large"
    assert second.headers["x-switchyard-model"] == "m-small"
    assert second.headers["x-switchyard-route"] == "auto:classifier=0.620>=0.450->small(large over budget)"
    assert too_big.value.body["code"] == "insufficient_quota"
    assert "worst-case cost" in too_big.value.body["message"]
    assert last.choices[0].message.content.startswith("large")
    assert refused.value.status_code == 429
    assert refused.value.body["code"] == "insufficient_quota" and refused.value.body["type"] == "insufficient_quota"
    assert "Team 'research' has spent its budget for today ($0.02)" in refused.value.body["message"]
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 86_400
    assert spent == pytest.approx(2 * cost_usd("m-large", "score=0.62") + cost_usd("m-small", "score=0.62"))

    with sqlite3.connect(ledger_path) as db:
        by_team = dict(db.execute("SELECT team, SUM(cost_usd) FROM usage GROUP BY team").fetchall())
    assert by_team["research"] == pytest.approx(spent)
    assert by_team["search"] == pytest.approx(cost_usd("m-small", "hi"))

    with proxy(urls, tmp_path) as (url, app), _sdk(url, "sk-research-2") as sdk:  # same team, other key
        with pytest.raises(openai.RateLimitError) as remembered:
            sdk.chat.completions.create(model="m-small", messages=[{"role": "user", "content": "hi"}])
    assert "has spent its budget for today" in remembered.value.body["message"]
    assert len(states["large"].records) == 2


@pytest.mark.parametrize(
    ("teams", "message"),
    [
        ({"a": {"api_keys": ["k"], "models": ["nope"]}}, "team 'a' may use 'nope', which is not a configured model"),
        ({"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}}, "an API key is listed twice (also under 'a')"),
        ({"a": {"api_keys": []}}, "teams.a.api_keys"),
        ({"a": {"api_keys": ["k"], "budget": 3}}, "unknown key 'teams.a.budget'"),
    ],
)
def test_bad_team_config_is_refused_with_the_key_named(tmp_path, teams, message):
    import yaml

    config = tmp_path / "switchyard.yaml"
    config.write_text(yaml.safe_dump({"models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1"}], "teams": teams}))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("$", r"\$")):
        load_settings(config)
    assert "sk-" not in message
