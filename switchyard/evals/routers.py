"""Routers to compare: each scores prompts in [0, 1], higher meaning 'needs the strong model more'.

One ABC with one scoring method, and a name -> class table, as in RouteLLM. `fit()` sees only
the train split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from switchyard.core.routers import Router
from switchyard.core.traces import Trace


class RandomRouter(Router):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return np.random.default_rng(self.seed).random(len(traces))


class AlwaysWeak(Router):
    name = "always-weak"

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return np.zeros(len(traces))


class AlwaysStrong(Router):
    name = "always-strong"

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return np.ones(len(traces))


class PromptLength(Router):
    """Longer prompts are harder: the score is the share of train prompts shorter than this one.

    A fixed transform (not a rank among the prompts being scored), so a threshold picked on the
    train split means the same on any other prompts.
    """

    name = "length"

    def __init__(self) -> None:
        self.train_lengths = np.array([])

    def fit(self, train: Sequence[Trace], weak: str, strong: str) -> None:
        self.train_lengths = np.sort([len(trace.prompt) for trace in train])

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        lengths = np.array([len(trace.prompt) for trace in traces], dtype=float)
        if not len(self.train_lengths):
            return lengths / (lengths + 500.0)
        return np.searchsorted(self.train_lengths, lengths, side="left") / len(self.train_lengths)


class CategoryPrior(Router):
    """The train split's strong-win rate (strong better than weak) of the prompt's category."""

    name = "category-prior"

    def __init__(self) -> None:
        self.rates: dict[str, float] = {}
        self.overall = 0.5

    def fit(self, train: Sequence[Trace], weak: str, strong: str) -> None:
        wins: dict[str, list[float]] = defaultdict(list)
        for trace in train:
            win = float(trace.models[strong].quality > trace.models[weak].quality)
            wins[trace.category].append(win)
        self.rates = {category: float(np.mean(values)) for category, values in wins.items()}
        all_wins = [w for values in wins.values() for w in values]
        self.overall = float(np.mean(all_wins)) if all_wins else 0.5

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return np.array([self.rates.get(trace.category, self.overall) for trace in traces])


class Oracle(Router):
    """Knows the outcomes: strong exactly where it is better. The ceiling, for reference."""

    name = "oracle"
    is_reference = True

    def __init__(self) -> None:
        self.weak = self.strong = ""

    def fit(self, train: Sequence[Trace], weak: str, strong: str) -> None:
        self.weak, self.strong = weak, strong

    def score(self, traces: Sequence[Trace]) -> np.ndarray:
        return np.array([float(t.models[self.strong].quality - t.models[self.weak].quality) / 2 + 0.5 for t in traces])


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (RandomRouter, AlwaysWeak, AlwaysStrong, PromptLength, CategoryPrior, Oracle)
}
FIXED_ROUTERS = ("always-weak", "always-strong")
DEFAULT_ROUTERS = ("random", "always-weak", "always-strong", "length", "category-prior", "oracle")


def make_router(name: str) -> Router:
    """A router by name; `classifier` is the shipped artifact, `classifier:<folder>` another one."""
    if name == "classifier" or name.startswith("classifier:"):  # imported on demand: it loads an embedding model
        from switchyard.classifier.model import DEFAULT_ARTIFACT, ArtifactError
        from switchyard.classifier.router import ClassifierRouter

        artifact = name.partition(":")[2] or DEFAULT_ARTIFACT
        try:
            router = ClassifierRouter(artifact)
        except ArtifactError as exc:
            raise ValueError(str(exc)) from exc
        if name != "classifier":
            router.name = f"classifier ({Path(artifact).name})"
        return router
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}, classifier[:<folder>]") from None
