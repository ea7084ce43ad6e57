"""The router interface: one ABC with one scoring method (as in RouteLLM).

A router scores prompts in [0, 1], higher meaning "needs the strong model more"; a threshold
picked offline on the train split turns the score into a route. `fit()` sees only the train split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from switchyard.core.traces import Trace


class Router(ABC):
    name: str = ""
    is_reference = False  # an upper bound for the table, not a router one could deploy

    def fit(self, train: Sequence[Trace], weak: str, strong: str) -> None:  # noqa: B027 - optional hook
        """Learn from the train split; most baselines need nothing."""

    @abstractmethod
    def score(self, traces: Sequence[Trace]) -> np.ndarray: ...
