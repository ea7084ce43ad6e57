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
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from switchyard.backends.embedded.sampler import SamplingParams, TokenChoice, choose_tokens


@dataclass(frozen=True, slots=True)
class Speculation:
    method: str = "prompt_lookup"  # prompt_lookup | off
    num_tokens: int = 8  # draft tokens verified per forward pass
    max_ngram: int = 3  # longest context suffix looked up
    min_ngram: int = 2  # a lone recurring token drafts too often in free writing

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
