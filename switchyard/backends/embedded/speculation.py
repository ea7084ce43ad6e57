"""Prompt-lookup speculation: draft tokens copied from the request's own context, verified by the model.

A draft is what followed the latest earlier occurrence of the context's last n tokens (the longest
n that occurs, from `max_ngram` down to `min_ngram`): answers that quote their prompt (RAG, code
edits) or repeat themselves continue the way the context did. The model scores the last token and
the drafts in one forward pass, and `verify` keeps drafts while the token the target model chooses
at each position is the draft itself.

That is the standard rejection scheme for a draft that puts all its probability on one token: the
draft d is kept with probability p(d) (= min(1, p(d)/q(d)) with q(d) = 1), and when it is not,
the token drawn is distributed as p without d, renormalised (the residual max(0, p - q)). Greedy
choices are the target's argmax at each position, so a greedy answer is the one decoding without
drafts gives; a seeded sampled answer draws from the same generator once per emitted token, so it
is the same one too. Logprobs are the target model's at each position.

A draft model (`draft_model.py`) proposes from a distribution q of its own; `verify_sampled` then
keeps draft d with probability min(1, p(d)/q(d)) and, at the first draft it does not keep, draws from
max(0, p - q) renormalised: the emitted tokens are distributed as the target's p (Leviathan et al.,
2023; Chen et al., 2023). Under greedy decoding the draft is the draft model's argmax and `verify`
applies unchanged.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from switchyard.backends.embedded.sampler import SamplingParams, TokenChoice, choose_tokens, sampling_probs


@dataclass(frozen=True, slots=True)
class Speculation:
    method: str = "prompt_lookup"  # prompt_lookup | draft_model | off
    num_tokens: int = 8  # draft tokens verified per forward pass
    max_ngram: int = 3  # longest context suffix looked up
    min_ngram: int = 2  # a lone recurring token drafts too often in free writing
    draft_model: str | None = None  # the model that drafts (method draft_model): a name, folder or GGUF

    @property
    def is_on(self) -> bool:
        return self.method != "off" and self.num_tokens > 0


class PromptLookup:
    """The context's n-grams, each mapped to the position that followed its latest occurrence."""

    def __init__(self, token_ids: list[int], speculation: Speculation) -> None:
        self.speculation = speculation
        self.ids: list[int] = []
        self._follower: dict[tuple[int, ...], int] = {}
        self.extend(token_ids)

    def extend(self, token_ids: list[int]) -> None:
        ids, follower = self.ids, self._follower
        sizes = range(self.speculation.min_ngram, self.speculation.max_ngram + 1)
        for token_id in token_ids:
            at = len(ids)
            for n in sizes:
                if at >= n:
                    follower[tuple(ids[at - n : at])] = at
            ids.append(token_id)

    def propose(self, max_tokens: int) -> list[int]:
        """Up to `max_tokens` drafts (never more than `num_tokens`); none when no suffix recurs."""
        limit = min(max_tokens, self.speculation.num_tokens)
        if limit <= 0:
            return []
        ids = self.ids
        for n in range(self.speculation.max_ngram, self.speculation.min_ngram - 1, -1):
            if len(ids) >= n and (at := self._follower.get(tuple(ids[-n:]))) is not None:
                return ids[at : at + limit]
        return []


def verify(
    logits: torch.Tensor, draft: list[int], params: SamplingParams, stop_ids: Collection[int]
) -> list[TokenChoice]:
    """The tokens one forward pass over [last token, *draft] yields: the drafts the target model
    chooses itself, then its own choice at the first position where it differs (or after the last
    draft). `logits` is [len(draft) + 1, vocab]. Stops after a token in `stop_ids` (EOS)."""
    choices: list[TokenChoice] = []
    for position in range(len(draft) + 1):
        choice = choose_tokens(logits[position : position + 1], [params])[0]
        choices.append(choice)
        if position == len(draft) or choice.token_id != draft[position] or choice.token_id in stop_ids:
            break
    return choices


def verify_sampled(
    logits: torch.Tensor,
    draft: list[int],
    draft_probs: list[torch.Tensor],
    params: SamplingParams,
    stop_ids: Collection[int],
) -> list[TokenChoice]:
    """`verify` for drafts sampled from a draft model's distributions `draft_probs` (one per draft,
    each summing to 1): draft d is kept with probability min(1, p(d)/q(d)), and the first one not
    kept is replaced by a draw from max(0, p - q), renormalised; after the last kept draft the
    target draws a token of its own. `logits` is [len(draft) + 1, vocab]."""
    logprobs = torch.log_softmax(logits, dim=-1)
    choices: list[TokenChoice] = []
    for position, (token_id, q) in enumerate(zip(draft, draft_probs, strict=True)):
        p = sampling_probs(logits[position], params)
        p = p / p.sum()
        u = float(torch.rand(1, generator=params.generator))
        if u * float(q[token_id]) < float(p[token_id]):  # u < p(d) / q(d), without dividing by zero
            choices.append(_choice(logprobs[position], token_id, params))
            if token_id in stop_ids:
                return choices
            continue
        residual = torch.clamp(p - q, min=0.0)
        weights = residual if float(residual.sum()) > 0 else p
        corrected = int(torch.multinomial(weights, num_samples=1, generator=params.generator))
        choices.append(_choice(logprobs[position], corrected, params))
        return choices
    bonus = choose_tokens(logits[len(draft) : len(draft) + 1], [params])[0]
    choices.append(bonus)
    return choices


def _choice(logprobs: torch.Tensor, token_id: int, params: SamplingParams) -> TokenChoice:
    top: list[tuple[int, float]] = []
    if params.top_logprobs:
        values, ids = torch.topk(logprobs, k=params.top_logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenChoice(token_id, float(logprobs[token_id]), top)
