"""The response cache through the proxy and the real `openai` SDK, against a fake upstream on
127.0.0.1: an exact hit answers without calling the model (whole, or replayed as the stream a live
one is), the headers say hit, miss or bypass, a team's answers never reach another team, entries
expire on the store's clock, an admin purges a team's, and a hit is metered (its ledger row,
/v1/usage, /metrics)."""

from __future__ import annotations

import itertools
from contextlib import ExitStack

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.clock import ManualClock
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_for_records

PRICE = 1000.0  # USD per million tokens, in and out: a hit saves a visible amount
ADMIN = "sk-admin"
TEAMS = {
    "alpha": {"api_keys": ["sk-alpha"]},
    "beta": {"api_keys": ["sk-beta"]},
    "gamma": {"api_keys": ["sk-gamma"], "cache": "off"},
}
_questions = itertools.count()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    state = FakeState()
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        price = {"input_usd_per_mtok": PRICE, "output_usd_per_mtok": PRICE}
        settings = Settings(
            models=[{"name": "m", "base_url": upstream, "price": price}],
            teams=TEAMS,
            auth={"admin_key": ADMIN},
            cache={"mode": "exact", "ttl_s": 60, "routes": {"m": {"nondeterministic": False}}},
            billing={"ledger_path": tmp_path_factory.mktemp("ledger") / "usage.db", "redis_url": "none"},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        clock = ManualClock()
        app.state.services.response_cache.store.clock = clock
        yield base, app, state, clock


def _sdk(base: str, key: str = "sk-alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)


def _question() -> list[dict]:
    return [{"role": "user", "content": f"What is the capital of country {next(_questions)}?"}]


def _ask(base: str, messages: list[dict], key: str = "sk-alpha", **kwargs):
    kwargs = {"temperature": 0, "max_tokens": 5} | kwargs
    with _sdk(base, key) as sdk:
        return sdk.chat.completions.with_raw_response.create(model="m", messages=messages, **kwargs)


def test_an_exact_repeat_is_answered_from_the_cache_without_the_model(proxy):
    base, _, state, _ = proxy
    messages = _question()
    first = _ask(base, messages)
    asked_before = state.num_requests
    second = _ask(base, messages, user="someone-else", extra_body={"metadata": {"run": 2}})
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "hit"
    assert state.num_requests == asked_before  # the model was not called again
    answers = first.parse(), second.parse()
    assert answers[1].choices[0].message.content == answers[0].choices[0].message.content
    assert answers[1].usage.total_tokens == answers[0].usage.total_tokens
    assert answers[1].id != answers[0].id  # a new answer, not the old one's id
    assert second.headers["x-switchyard-model"] == "m"
    assert second.headers["x-switchyard-backend"] == "response-cache"
    assert float(second.headers["x-switchyard-cost-usd"]) == 0.0
    # another question, other sampling or another answer length is another key
    assert _ask(base, messages, max_tokens=6).headers["x-switchyard-cache"] == "miss"
    assert _ask(base, messages, seed=1).headers["x-switchyard-cache"] == "miss"


def _chunks(raw) -> list[dict]:
    return [chunk.model_dump(exclude={"id", "created"}, exclude_none=True) for chunk in raw.parse()]


def test_a_stream_is_replayed_with_the_shapes_a_live_stream_has(proxy):
    base, _, state, _ = proxy
    messages = _question()
    live = _ask(base, messages, stream=True, stream_options={"include_usage": True})
    live_chunks = _chunks(live)
    asked_before = state.num_requests
    replayed = _ask(base, messages, stream=True, stream_options={"include_usage": True})
    replayed_chunks = _chunks(replayed)
    assert (live.headers["x-switchyard-cache"], replayed.headers["x-switchyard-cache"]) == ("miss", "hit")
    assert state.num_requests == asked_before

    def text(chunks):
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])

    assert text(replayed_chunks) == text(live_chunks) and text(live_chunks)
    assert replayed_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0].get("finish_reason") for c in replayed_chunks if c["choices"]]
    assert finishes[-1] == live_chunks[-2]["choices"][0]["finish_reason"] and not any(finishes[:-1])
    # the usage chunk last, with no choices, its counts the live one's and the hit's cost (0)
    live_usage, replayed_usage = live_chunks[-1]["usage"], replayed_chunks[-1]["usage"]
    assert replayed_chunks[-1]["choices"] == []
    assert replayed_usage["total_tokens"] == live_usage["total_tokens"]
    assert replayed_usage["cost_usd"] == 0.0
    # a whole request is answered from the streamed answer too, and a stream without usage has none
    assert _ask(base, messages).headers["x-switchyard-cache"] == "hit"
    quiet = _chunks(_ask(base, messages, stream=True))
    assert all("usage" not in c for c in quiet) and text(quiet) == text(live_chunks)


def _runs(types: list[str]) -> list[str]:
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def test_a_messages_stream_replayed_from_the_cache_is_the_live_streams_events(proxy):
    base, _, state, _ = proxy
    question = _question()[0]["content"]
    client = anthropic.Anthropic(base_url=base, api_key="sk-alpha", max_retries=0)

    def events():
        with client.messages.with_streaming_response.create(
            model="m",
            max_tokens=5,
            messages=[{"role": "user", "content": question}],
            stream=True,
            extra_body={"temperature": 0},
        ) as raw:
            return raw.headers["x-switchyard-cache"], [event.type for event in raw.parse()]

    live = events()
    asked_before = state.num_requests
    replayed = events()
    assert (live[0], replayed[0]) == ("miss", "hit")
    # the same events in the same order (a replay sends the text in one delta, a live stream in many)
    assert _runs(replayed[1]) == _runs(live[1]) and "content_block_delta" in live[1]
    assert state.num_requests == asked_before


def test_the_client_and_nondeterministic_requests_bypass_it(proxy):
    base, _, state, _ = proxy
    messages = _question()
    _ask(base, messages)
    asked_before = state.num_requests
    with _sdk(base) as sdk:
        off = sdk.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=5, temperature=0, extra_headers={"x-switchyard-cache": "off"}
        )
        no_cache = sdk.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=5, temperature=0, extra_headers={"Cache-Control": "no-cache"}
        )
    warm = _ask(base, messages, temperature=0.7)
    several = _ask(base, messages, n=2)
    for raw in (off, no_cache, warm, several):
        assert raw.headers["x-switchyard-cache"] == "bypass"
    assert state.num_requests == asked_before + 4  # each went to the model
    # a team whose cache is off: no header at all
    assert "x-switchyard-cache" not in _ask(base, messages, key="sk-gamma").headers


def test_two_teams_with_the_same_prompt_never_share_an_answer(proxy):
    base, _, state, _ = proxy
    messages = _question()
    alpha = _ask(base, messages, key="sk-alpha")
    beta = _ask(base, messages, key="sk-beta")
    assert (alpha.headers["x-switchyard-cache"], beta.headers["x-switchyard-cache"]) == ("miss", "miss")
    assert _ask(base, messages, key="sk-beta").headers["x-switchyard-cache"] == "hit"


def test_an_entry_expires_after_its_ttl(proxy):
    base, _, _, clock = proxy
    messages = _question()
    _ask(base, messages)
    clock.advance(59)
    assert _ask(base, messages).headers["x-switchyard-cache"] == "hit"
    clock.advance(2)
    assert _ask(base, messages).headers["x-switchyard-cache"] == "miss"


def test_an_admin_purges_a_teams_entries_and_only_theirs(proxy):
    base, _, _, _ = proxy
    messages = _question()
    _ask(base, messages, key="sk-alpha")
    _ask(base, messages, key="sk-beta")
    admin = {"Authorization": f"Bearer {ADMIN}"}
    purged = httpx.delete(base + "/admin/cache", params={"team": "alpha"}, headers=admin)
    assert purged.status_code == 200 and purged.json()["deleted"] >= 1
    assert _ask(base, messages, key="sk-alpha").headers["x-switchyard-cache"] == "miss"
    assert _ask(base, messages, key="sk-beta").headers["x-switchyard-cache"] == "hit"
    unknown = httpx.delete(base + "/admin/cache", params={"team": "nobody"}, headers=admin)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "team"
    assert httpx.delete(base + "/admin/cache", params={"team": "alpha"}).status_code == 401


def test_a_hit_is_metered_in_the_ledger_usage_and_metrics(proxy):
    base, app, _, _ = proxy
    messages = _question()
    miss = _ask(base, messages, key="sk-beta")
    hit = _ask(base, messages, key="sk-beta")
    [missed] = wait_for_records(app, 1, request_id=miss.headers["x-request-id"])
    [record] = wait_for_records(app, 1, request_id=hit.headers["x-request-id"])
    assert (missed.response_cache, missed.response_cache_saved_usd) == ("miss", None)
    assert missed.cost_usd > 0
    assert (record.status, record.response_cache, record.backend) == ("completed", "hit", "response-cache")
    assert (record.cost_usd, record.prompt_tokens, record.completion_tokens) == (0.0, 0, 0)
    assert record.response_cache_saved_usd == pytest.approx(missed.cost_usd)
    assert record.response_cache_saved_tokens == missed.prompt_tokens + missed.completion_tokens
    usage = httpx.get(base + "/v1/usage", headers={"Authorization": "Bearer sk-beta"}).json()
    totals = usage
    assert totals["response_cache_hits"] >= 1 and totals["response_cache_misses"] >= 1
    assert totals["response_cache_saved_usd"] >= round(missed.cost_usd, 6) > 0
    by_route = httpx.get(
        base + "/v1/usage", headers={"Authorization": "Bearer sk-beta"}, params={"group_by": "route"}
    ).json()
    assert sum(row["response_cache_hits"] for row in by_route["data"]) == totals["response_cache_hits"]
    metrics = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(
            httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
        )
        for sample in family.samples
    }
    hits = metrics[("switchyard_response_cache_requests_total", (("result", "hit"), ("route", "m"), ("team", "beta")))]
    saved = metrics[("switchyard_response_cache_saved_usd_total", (("route", "m"), ("team", "beta")))]
    assert hits >= 1 and saved >= missed.cost_usd
    assert metrics[("switchyard_response_cache_entries", ())] >= 1
