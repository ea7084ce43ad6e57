"""The guard: refuses a semantic neighbour whose question needs another answer (docs/cache.md).

A minimal guard (numbers only) until the measured one replaces it."""

from __future__ import annotations

import re

DEFAULT_SIMILARITY: float = 0.9

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def guard_reason(asked: str, cached: str) -> str | None:
    """None when `asked` may be answered with `cached`'s answer, else why not."""
    if _NUMBER.findall(asked) != _NUMBER.findall(cached):
        return "number"
    return None
