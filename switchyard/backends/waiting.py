"""The queue in front of a model, as this proxy sees it: tokens it has sent there that have no first
token yet.

vLLM and hosted APIs report waiting requests at best, never waiting tokens, so the proxy counts
them itself. An attempt is held from the call until its first token (a stream's first chunk; a
whole answer's arrival; an assembled answer's first chunk) or its end, whichever comes first. Its
weight is the request's worst case: the prompt estimate plus `max_tokens` (or
`ANSWER_TOKENS_FOR_COST` when unset), for each answer asked. One process's count: with several
workers, each counts what it sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class Held:
    """One attempt's tokens, until `release()` (idempotent)."""

    __slots__ = ("model", "num_tokens", "owner")

    def __init__(self, owner: WaitingTokens, model: str, num_tokens: int) -> None:
        self.owner, self.model, self.num_tokens = owner, model, num_tokens

    def release(self) -> None:
        if self.num_tokens:
            self.owner.by_model[self.model] -= self.num_tokens
            self.num_tokens = 0


class WaitingTokens:
    """Tokens per model of the attempts waiting for their first token."""

    def __init__(self) -> None:
        self.by_model: Counter[str] = Counter()

    def of(self, model: str) -> int:
        return self.by_model[model]

    @contextmanager
    def hold(self, model: str, num_tokens: int) -> Iterator[Held]:
        self.by_model[model] += num_tokens
        held = Held(self, model, num_tokens)
        try:
            yield held
        finally:
            held.release()
