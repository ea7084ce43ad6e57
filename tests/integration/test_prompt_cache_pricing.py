"""Prompt caching on an Anthropic model through LiteLLM, against the fake Anthropic API on 127.0.0.1
with the real `openai` SDK: a request with `cache_control` blocks writes the prompt's prefix to the
cache, the next one reads it. The answer's usage counts every input token in `prompt_tokens`, the
reads in `prompt_tokens_details.cached_tokens` and the writes in `cache_creation_input_tokens`; the
ledger, the cost, `/v1/usage` and `/metrics` price and count both, streamed or not."""

from __future__ import annotations

import datetime as dt
import itertools
from contextlib import ExitStack

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_for_records

PRICE = Price(3.0, 15.0, cached_input_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75)
UNCACHED, CACHED = 12, 2048  # the fake's input tokens after the breakpoint, and up to it
_prompts = itertools.count()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    state = AnthropicState(cached_prefix_tokens=CACHED)
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(state)))
        claude = {"backend": "litellm", "base_url": upstream, "api_key": "sk-ant-test"}
        settings = Settings(
            models=[
                {
                    "name": "claude",
                    "litellm_model": "anthropic/claude-sonnet-4-5",
                    "price": {
                        "input_usd_per_mtok": PRICE.input_usd_per_mtok,
                        "output_usd_per_mtok": PRICE.output_usd_per_mtok,
                        "cached_input_usd_per_mtok": PRICE.cached_input_usd_per_mtok,
                        "cache_write_usd_per_mtok": PRICE.cache_write_usd_per_mtok,
                    },
                    **claude,
                },
                {"name": "claude-listed", "litellm_model": "anthropic/claude-haiku-4-5", **claude},
            ],
            resilience={"max_attempts": 1},
            billing={"ledger_path": tmp_path_factory.mktemp("ledger") / "usage.db"},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        sdk = stack.enter_context(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=60))
        yield base, sdk, app


def _cached_messages() -> list[dict]:
    """A system prompt marked for caching that no earlier request sent, then a question."""
    rules = {"type": "text", "text": f"Rules, version {next(_prompts)}.", "cache_control": {"type": "ephemeral"}}
    return [{"role": "system", "content": [rules]}, {"role": "user", "content": "hi"}]


def _cost(read: int, written: int, completion: int = 3) -> float:
    return PRICE.cost_usd(UNCACHED + read + written, completion, read, written)


def test_a_cache_write_then_a_read_are_reported_metered_and_priced(proxy):
    _, sdk, app = proxy
    messages = _cached_messages()
    raws = [sdk.chat.completions.with_raw_response.create(model="claude", messages=messages, max_tokens=50)]
    raws.append(sdk.chat.completions.with_raw_response.create(model="claude", messages=messages, max_tokens=50))
    for raw, (read, written) in zip(raws, [(0, CACHED), (CACHED, 0)], strict=True):
        usage = raw.parse().usage
        assert usage.prompt_tokens == UNCACHED + CACHED  # every input token
        assert usage.prompt_tokens_details.cached_tokens == read
        assert usage.model_extra["cache_creation_input_tokens"] == written
        assert float(raw.headers["x-switchyard-cost-usd"]) == pytest.approx(_cost(read, written), abs=1e-8)
        [record] = wait_for_records(app, 1, request_id=raw.headers["x-request-id"])
        assert (record.prompt_tokens, record.cache_read_tokens, record.cache_write_tokens) == (
            UNCACHED + CACHED,
            read,
            written,
        )
        assert record.cost_usd == pytest.approx(_cost(read, written))
    # the write cost more than plain input, the read less
    plain = PRICE.cost_usd(UNCACHED + CACHED, 3)
    assert _cost(CACHED, 0) < plain < _cost(0, CACHED)


def test_a_streams_usage_chunk_and_its_record_carry_the_cache_tokens_and_their_price(proxy):
    _, sdk, app = proxy
    messages = _cached_messages()
    for read, written in [(0, CACHED), (CACHED, 0)]:
        raw = sdk.chat.completions.with_raw_response.create(
            model="claude", messages=messages, max_tokens=50, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(raw.parse())
        usage = chunks[-1].usage
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "bonjour from claude "
        assert usage.prompt_tokens == UNCACHED + CACHED and usage.completion_tokens == 3
        assert usage.prompt_tokens_details.cached_tokens == read
        assert usage.model_extra["cache_creation_input_tokens"] == written
        assert usage.model_extra["cost_usd"] == pytest.approx(_cost(read, written), abs=1e-8)
        [record] = wait_for_records(app, 1, request_id=raw.headers["x-request-id"])
        assert (record.cache_read_tokens, record.cache_write_tokens, record.is_estimated) == (read, written, False)
        assert record.cost_usd == pytest.approx(_cost(read, written))


def test_without_cache_control_nothing_is_read_or_written(proxy):
    _, sdk, app = proxy
    raw = sdk.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "hi"}], max_tokens=50
    )
    assert raw.parse().usage.prompt_tokens == UNCACHED
    [record] = wait_for_records(app, 1, request_id=raw.headers["x-request-id"])
    assert (record.cache_read_tokens, record.cache_write_tokens) == (0, 0)
    assert record.cost_usd == pytest.approx(PRICE.cost_usd(UNCACHED, 3))


def test_litellms_price_map_prices_cache_reads_and_writes_unless_the_config_does(proxy):
    _, _, app = proxy
    prices = app.state.services.prices
    assert prices["claude"] == PRICE  # the config's, whole
    listed = prices["claude-listed"]  # claude-haiku-4-5 as LiteLLM's map lists it
    assert (listed.input_usd_per_mtok, listed.output_usd_per_mtok) == pytest.approx((1.0, 5.0))
    assert (listed.cached_input_usd_per_mtok, listed.cache_write_usd_per_mtok) == pytest.approx((0.1, 1.25))


def test_usage_and_metrics_sum_the_cache_tokens_per_model(proxy):
    base, sdk, app = proxy
    messages = _cached_messages()
    ids = [
        sdk.chat.completions.with_raw_response.create(model="claude-listed", messages=messages, max_tokens=50).headers[
            "x-request-id"
        ]
        for _ in range(2)
    ]
    for request_id in ids:
        wait_for_records(app, 1, request_id=request_id)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    usage = httpx.get(
        base + "/v1/usage", params={"group_by": "model", "start_date": today, "end_date": today}, timeout=30
    ).json()
    listed = next(row for row in usage["data"] if row["model"] == "claude-listed")
    assert (listed["cache_read_tokens"], listed["cache_write_tokens"]) == (CACHED, CACHED)
    assert listed["prompt_tokens"] == 2 * (UNCACHED + CACHED)
    assert usage["cache_read_tokens"] >= CACHED and usage["cache_write_tokens"] >= CACHED
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text)}
    samples = {
        (s.labels["model"], s.labels["kind"]): s.value
        for s in families["switchyard_cache_tokens"].samples
        if s.name == "switchyard_cache_tokens_total"
    }
    assert (samples[("claude-listed", "read")], samples[("claude-listed", "write")]) == (CACHED, CACHED)
