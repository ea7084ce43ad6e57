"""One price type and one token estimate: what metering, routing and the evals all compute cost with."""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English
USD_DECIMALS = 8  # money in outputs (/v1/usage, the report's summary): the x-switchyard-cost-usd header's precision


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input and output tokens, input tokens read from a prompt cache and input
    tokens written to one (None: priced as the other input tokens)."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None

    def cost_usd(
        self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0, cache_write_tokens: int = 0
    ) -> float:
        """`cached_input_tokens` (read from a prompt cache) and `cache_write_tokens` (written to
        one) are counted among `input_tokens`, as OpenAI's usage counts cached tokens."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        written = min(max(cache_write_tokens, 0), input_tokens - cached)
        uncached_usd = (input_tokens - cached - written) * self.input_usd_per_mtok
        cached_usd = cached * _or(self.cached_input_usd_per_mtok, self.input_usd_per_mtok)
        written_usd = written * _or(self.cache_write_usd_per_mtok, self.input_usd_per_mtok)
        return (uncached_usd + cached_usd + written_usd + output_tokens * self.output_usd_per_mtok) / 1e6

    def scaled(self, factor: float) -> Price:
        cached, written = self.cached_input_usd_per_mtok, self.cache_write_usd_per_mtok
        return Price(
            self.input_usd_per_mtok * factor,
            self.output_usd_per_mtok * factor,
            None if cached is None else cached * factor,
            None if written is None else written * factor,
        )


def _or(price: float | None, default: float) -> float:
    return default if price is None else price


def round_usd(value: float) -> float:
    """A USD amount as outputs show it: sums of float costs carry noise (0.02793500000000001)."""
    return round(value, USD_DECIMALS) + 0.0  # + 0.0: no "-0.0"


def estimate_tokens(text: str) -> int:
    """Tokens in `text` when no tokenizer's count is at hand: four characters a token, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
