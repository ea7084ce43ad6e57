"""Prompt tokens read from an upstream's prefix cache (`usage.prompt_tokens_details.cached_tokens`,
as OpenAI, vLLM and the embedded engine report them), priced at `cached_input_usd_per_mtok`, and
tokens written to a prompt cache (`usage.cache_creation_input_tokens`, as LiteLLM reports
Anthropic's), priced at `cache_write_usd_per_mtok`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from switchyard.billing.metering import RequestMeter, cache_write_tokens, cached_prompt_tokens, usage_of
from switchyard.core.chat_wire import CompletionResult
from switchyard.core.model_settings import PriceSettings
from switchyard.core.prices import Price

PRICE = Price(input_usd_per_mtok=2.0, output_usd_per_mtok=8.0, cached_input_usd_per_mtok=0.5)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "prompt_tokens_details": {"cached_tokens": 600}}


@dataclass
class Entry:
    name: str
    backend_kind: str = "openai"
    tier: str | None = None
    hosting: str | None = None


def test_cached_prompt_tokens_are_priced_at_their_own_rate():
    assert PRICE.cost_usd(1000, 100, 600) == pytest.approx((400 * 2.0 + 600 * 0.5 + 100 * 8.0) / 1e6)
    assert PRICE.cost_usd(1000, 100) == pytest.approx((1000 * 2.0 + 100 * 8.0) / 1e6)
    assert PRICE.cost_usd(10, 0, 600) == pytest.approx(10 * 0.5 / 1e6)  # never more cached than prompt


def test_without_a_cached_price_cached_tokens_cost_what_other_prompt_tokens_do():
    price = Price(2.0, 8.0)
    assert price.cost_usd(1000, 100, 600) == price.cost_usd(1000, 100)


def test_the_config_key_is_optional_and_scaled_with_the_rest():
    assert PriceSettings(input_usd_per_mtok=2, output_usd_per_mtok=8).to_price().cached_input_usd_per_mtok is None
    settings = PriceSettings(input_usd_per_mtok=2, output_usd_per_mtok=8, cached_input_usd_per_mtok=0.5)
    assert settings.to_price() == PRICE
    assert PRICE.scaled(0.5) == Price(1.0, 4.0, 0.25)
    assert Price(2.0, 8.0).scaled(0.5) == Price(1.0, 4.0)
    assert Price(2.0, 8.0, 0.5, 2.5).scaled(0.5) == Price(1.0, 4.0, 0.25, 1.25)
    written = PriceSettings(input_usd_per_mtok=3, output_usd_per_mtok=15, cache_write_usd_per_mtok=3.75)
    assert written.to_price() == Price(3.0, 15.0, None, 3.75)


ANTHROPIC = Price(
    input_usd_per_mtok=3.0, output_usd_per_mtok=15.0, cached_input_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75
)


def test_cache_writes_are_priced_at_their_own_rate_among_the_input_tokens():
    # 12 uncached, 2048 written, 100 read: 2160 input tokens in all
    expected = (12 * 3.0 + 2048 * 3.75 + 100 * 0.3 + 5 * 15.0) / 1e6
    assert ANTHROPIC.cost_usd(2160, 5, 100, 2048) == pytest.approx(expected)
    # never more read and written than input tokens: reads first, then writes
    assert ANTHROPIC.cost_usd(10, 0, 4, 100) == pytest.approx((4 * 0.3 + 6 * 3.75) / 1e6)
    assert ANTHROPIC.cost_usd(10, 0, 0, -5) == ANTHROPIC.cost_usd(10, 0)


def test_without_a_write_price_written_tokens_cost_what_other_prompt_tokens_do():
    assert PRICE.cost_usd(1000, 100, 600, 300) == PRICE.cost_usd(1000, 100, 600)


@pytest.mark.parametrize(
    ("usage", "written"),
    [
        ({"prompt_tokens": 2060, "cache_creation_input_tokens": 2048}, 2048),
        ({"prompt_tokens": 5, "cache_creation_input_tokens": 0}, 0),
        ({"prompt_tokens": 5, "cache_creation_input_tokens": None}, 0),
        ({"prompt_tokens": 5}, 0),
        (None, 0),
    ],
)
def test_cache_writes_are_read_from_the_usages_top_level(usage, written):
    assert cache_write_tokens(usage) == written


def test_an_attempts_cost_prices_its_cache_writes_and_reads():
    usage = {
        "prompt_tokens": 2160,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 100},
        "cache_creation_input_tokens": 2048,
    }
    meter = RequestMeter(None, {"m": ANTHROPIC}, "req_1")
    assert meter.usage_cost_usd("m", usage) == pytest.approx(ANTHROPIC.cost_usd(2160, 5, 100, 2048))
    meter.finished(Entry("m"), "completed", usage)
    assert meter.total_cost_usd == pytest.approx(ANTHROPIC.cost_usd(2160, 5, 100, 2048))
    assert meter.totals.prompt_tokens == 2160


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        (USAGE, 600),
        ({"prompt_tokens": 5, "completion_tokens": 1}, 0),
        ({"prompt_tokens": 5, "prompt_tokens_details": None}, 0),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"audio_tokens": 0}}, 0),
        ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": "3"}}, 0),
        (None, 0),
    ],
)
def test_cached_tokens_are_read_from_openais_usage_shape(usage, cached):
    assert cached_prompt_tokens(usage) == cached


def test_usage_with_details_is_found_in_a_whole_answer_without_parsing_it():
    body = (
        b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"{}"}}],'
        b'"usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":600},'
        b'"completion_tokens_details":{"reasoning_tokens":0},"total_tokens":1100}}'
    )
    usage = usage_of(CompletionResult(body))
    assert usage is not None and cached_prompt_tokens(usage) == 600
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_an_attempts_cost_prices_its_cached_tokens():
    meter = RequestMeter(None, {"m": PRICE}, "req_1")
    meter.finished(Entry("m"), "completed", USAGE)
    assert meter.total_cost_usd == pytest.approx(PRICE.cost_usd(1000, 100, 600))
    assert meter.totals.prompt_tokens == 1000  # cached tokens are prompt tokens still
