"""Least-outstanding-requests choice among the replicas of one model."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol, TypeVar


class Balanced(Protocol):
    num_outstanding: int
    is_ready: bool


R = TypeVar("R", bound=Balanced)


class LeastOutstanding:
    """Picks the ready replica with the fewest requests in flight; ties rotate.

    When no replica is known to be ready the least busy one is still returned: a health verdict
    can be stale, and the request's own error is more useful to the client than a guess.
    """

    def __init__(self) -> None:
        self._counter = itertools.count()

    def pick(self, replicas: Sequence[R]) -> R:
        if len(replicas) == 1:
            return replicas[0]
        ready = [r for r in replicas if r.is_ready] or list(replicas)
        fewest = min(r.num_outstanding for r in ready)
        tied = [r for r in ready if r.num_outstanding == fewest]
        return tied[next(self._counter) % len(tied)]
