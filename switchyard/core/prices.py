"""One price type and one token estimate: what metering, routing and the evals all compute cost with."""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb for English


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million input and output tokens."""

    input_usd_per_mtok: float
    output_usd_per_mtok: float

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6


def estimate_tokens(text: str) -> int:
    """Tokens in `text` when no tokenizer's count is at hand: four characters a token, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
