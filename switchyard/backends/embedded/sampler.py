"""Choosing the next token for each row of a continuous batch, with OpenAI-style logprobs.

Replaces the sampling step of transformers' continuous-batching model runner so that each request
keeps its own temperature, top_p and seed, and so that logprobs are those of the model's own
distribution (before temperature), with the top alternatives when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

MAX_TOP_LOGPROBS = 20


class TokenConstraint(Protocol):
    """What a request's tokens must follow (a JSON grammar, `constraints.py`)."""

    def allowed_token_ids(self) -> torch.Tensor: ...

    def advance(self, token_id: int) -> None: ...


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0  # alternatives to keep per token (0..20)
    generator: torch.Generator | None = field(default=None, repr=False)
    constraint: TokenConstraint | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.temperature > 0 and self.seed is not None:
            self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(slots=True)
class TokenChoice:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


def choose_tokens(logits: torch.Tensor, params: list[SamplingParams]) -> list[TokenChoice]:
    """One token per row of `logits` ([rows, vocab], float32), following that row's parameters."""
    logprobs = torch.log_softmax(logits, dim=-1)
    choices = []
    max_top = max((p.top_logprobs for p in params), default=0)
    top_values, top_ids = torch.topk(logprobs, k=max_top, dim=-1) if max_top else (None, None)
    for row, p in enumerate(params):
        row_logits = logits[row] if p.constraint is None else _masked(logits[row], p.constraint.allowed_token_ids())
        if p.is_greedy:
            token_id = int(torch.argmax(row_logits))
        else:
            token_id = _sample(row_logits, p)
        if p.constraint is not None:
            p.constraint.advance(token_id)
        top: list[tuple[int, float]] = []
        if p.top_logprobs and top_ids is not None and top_values is not None:
            top = list(
                zip(top_ids[row, : p.top_logprobs].tolist(), top_values[row, : p.top_logprobs].tolist(), strict=True)
            )
        choices.append(TokenChoice(token_id, float(logprobs[row, token_id]), top))
    return choices


def _masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    masked = torch.full_like(logits, float("-inf"))
    masked[allowed] = logits[allowed]
    return masked


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled token is drawn from (temperature, then top_p); `logits` is one row.
    Unnormalised after top_p (`torch.multinomial` takes weights)."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, sorted_ids[keep], sorted_probs[keep])
    return probs


def _sample(logits: torch.Tensor, params: SamplingParams) -> int:
    return int(torch.multinomial(sampling_probs(logits, params), num_samples=1, generator=params.generator))
