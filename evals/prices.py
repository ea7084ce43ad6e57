"""Prices per million tokens, and the token estimate used where a dataset has no counts."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Price:
    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6


# List prices at the time the RouteLLM data was made (OpenAI's for GPT-4 Turbo; a typical hosted
# price for Mixtral-8x7B). Override per run with a YAML file of the same shape.
PRICES: dict[str, Price] = {
    "gpt-4-1106-preview": Price(10.0, 30.0),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": Price(0.6, 0.6),
}


def estimate_tokens(text: str) -> int:
    """About four characters a token for English (OpenAI's rule of thumb); at least one."""
    return max(1, math.ceil(len(text) / 4))
