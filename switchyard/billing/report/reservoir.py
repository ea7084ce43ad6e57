"""Percentiles over a stream in bounded memory: a uniform reservoir sample (Vitter's algorithm R).

Up to `capacity` values the sample is the whole stream and the percentiles are exact; beyond it,
each value seen has the same chance to be in the sample. The generator is seeded, so one input
always gives one report.
"""

from __future__ import annotations

import random

import numpy as np

DEFAULT_CAPACITY = 4096


class Reservoir:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, seed: int = 0) -> None:
        self.capacity = capacity
        self.num_seen = 0
        self._sample: list[float] = []
        self._random = random.Random(seed)

    def add(self, value: float) -> None:
        self.num_seen += 1
        if len(self._sample) < self.capacity:
            self._sample.append(value)
            return
        slot = self._random.randrange(self.num_seen)
        if slot < self.capacity:
            self._sample[slot] = value

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0..100, linear interpolation between samples); None when empty."""
        if not self._sample:
            return None
        return float(np.percentile(self._sample, q))
