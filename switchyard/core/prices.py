"""One price type and one token estimate: what metering, routing and the evals all compute cost with."""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English
USD_DECIMALS = 8  # money in outputs (/v1/usage, the report's summary): the x-switchyard-cost-usd header's precision


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input and output tokens, and input tokens read from a prefix cache (None:
    priced as the other input tokens)."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_input_usd_per_mtok: float | None = None

    def cost_usd(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> float:
        """`cached_input_tokens` are counted among `input_tokens`, as OpenAI's usage counts them."""
        cached = min(max(cached_input_tokens, 0), input_tokens)
        cached_price = self.cached_input_usd_per_mtok
        if cached_price is None:
            cached_price = self.input_usd_per_mtok
        uncached_usd = (input_tokens - cached) * self.input_usd_per_mtok
        return (uncached_usd + cached * cached_price + output_tokens * self.output_usd_per_mtok) / 1e6

    def scaled(self, factor: float) -> Price:
        cached = self.cached_input_usd_per_mtok
        cached_scaled = None if cached is None else cached * factor
        return Price(self.input_usd_per_mtok * factor, self.output_usd_per_mtok * factor, cached_scaled)


def round_usd(value: float) -> float:
    """A USD amount as outputs show it: sums of float costs carry noise (0.02793500000000001)."""
    return round(value, USD_DECIMALS) + 0.0  # + 0.0: no "-0.0"


def estimate_tokens(text: str) -> int:
    """Tokens in `text` when no tokenizer's count is at hand: four characters a token, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
