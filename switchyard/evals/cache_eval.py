"""How often the semantic cache would answer right and wrong: prompt pairs labelled "same" (the
cached answer may serve the asked prompt) or "different", their cosine similarity, the guard's
verdict, and the threshold `switchyard eval cache` picks (docs/cache.md, "Measuring it")."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from switchyard.cache.guard import guard_reason

SHIPPED_PAIRS = Path(__file__).parent / "data" / "cache_pairs" / "pairs.jsonl.gz"
MAX_FALSE_HIT_RATE = 0.005
THRESHOLDS = tuple(round(0.5 + 0.005 * i, 3) for i in range(100))  # 0.500 … 0.995
LABELS = ("same", "different")
PARTS = ("tune", "held_out")


class PairsError(ValueError):
    """A pairs file that cannot be read; the message names the file and row."""


@dataclass(frozen=True, slots=True)
class CachePair:
    asked: str
    cached: str
    label: str  # "same" | "different"
    kind: str  # the rule that made the pair (data/cache_pairs/make.py)
    part: str  # "tune" | "held_out"


def load_pairs(path: Path = SHIPPED_PAIRS) -> list[CachePair]:
    """The pairs of a .jsonl or .jsonl.gz file: one object a line with asked, cached, label, kind
    and (optional, default "held_out") part."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except OSError as exc:
        raise PairsError(f"cannot read {path}: {exc}") from exc
    pairs = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            pair = CachePair(
                str(row["asked"]), str(row["cached"]), row["label"], str(row["kind"]), row.get("part", "held_out")
            )
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise PairsError(f"{path}, line {number}: not a pair ({exc!r})") from exc
        if pair.label not in LABELS or pair.part not in PARTS:
            raise PairsError(f"{path}, line {number}: label must be one of {LABELS}, part one of {PARTS}")
        pairs.append(pair)
    if not pairs:
        raise PairsError(f"{path}: no pairs")
    return pairs


def similarities(pairs: Sequence[CachePair], encode: Callable[[list[str]], np.ndarray]) -> np.ndarray:
    """Each pair's cosine similarity; `encode` gives L2-normalised rows, each text embedded once."""
    texts = sorted({t for p in pairs for t in (p.asked, p.cached)})
    matrix = encode(texts)
    row = {text: i for i, text in enumerate(texts)}
    asked = matrix[[row[p.asked] for p in pairs]]
    cached = matrix[[row[p.cached] for p in pairs]]
    return np.einsum("ij,ij->i", asked, cached).astype(np.float64)


def guard_reasons(pairs: Sequence[CachePair]) -> list[str | None]:
    return [guard_reason(p.asked, p.cached) for p in pairs]


@dataclass(frozen=True, slots=True)
class PairScores:
    """Everything a threshold needs, one entry a pair."""

    pairs: Sequence[CachePair]
    similarity: np.ndarray
    reasons: Sequence[str | None]

    def mask(self, part: str | None = None, label: str | None = None, kind: str | None = None) -> np.ndarray:
        return np.array(
            [
                (part is None or p.part == part)
                and (label is None or p.label == label)
                and (kind is None or p.kind == kind)
                for p in self.pairs
            ],
            dtype=bool,
        )

    def hits(self, threshold: float, guarded: bool) -> np.ndarray:
        hit = self.similarity >= threshold
        if guarded:
            hit &= np.array([r is None for r in self.reasons], dtype=bool)
        return hit

    def rate(self, threshold: float, guarded: bool, **where: str | None) -> float:
        """The share of the pairs `where` selects that would be served from the cache (nan if none)."""
        mask = self.mask(**where)
        return float(self.hits(threshold, guarded)[mask].mean()) if mask.any() else float("nan")


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    threshold: float
    hit_rate: float  # on "same" pairs
    false_hit_rate: float  # on "different" pairs


def operating_point(scores: PairScores, threshold: float, guarded: bool, part: str | None) -> OperatingPoint:
    return OperatingPoint(
        threshold,
        scores.rate(threshold, guarded, part=part, label="same"),
        scores.rate(threshold, guarded, part=part, label="different"),
    )


def sweep(scores: PairScores, guarded: bool, part: str | None, thresholds: Sequence[float] = THRESHOLDS):
    return [operating_point(scores, t, guarded, part) for t in thresholds]


def pick_threshold(
    scores: PairScores, max_false_hit_rate: float = MAX_FALSE_HIT_RATE, thresholds: Sequence[float] = THRESHOLDS
) -> OperatingPoint | None:
    """The threshold with the highest hit rate on the held-out "same" pairs whose false-hit rate with
    the guard stays within `max_false_hit_rate` on the held-out "different" pairs (and on the tuning
    ones, where there are any); the higher threshold on a tie. None if no threshold qualifies."""
    has_tune = scores.mask(part="tune").any()
    best: OperatingPoint | None = None
    for threshold in thresholds:
        point = operating_point(scores, threshold, True, "held_out")
        tune = operating_point(scores, threshold, True, "tune") if has_tune else point
        if point.false_hit_rate > max_false_hit_rate or tune.false_hit_rate > max_false_hit_rate:
            continue
        if best is None or point.hit_rate >= best.hit_rate:
            best = point
    return best


def cosine_only_at(scores: PairScores, hit_rate: float, part: str | None, thresholds: Sequence[float] = THRESHOLDS):
    """The cosine-only baseline where it serves at least `hit_rate` of the "same" pairs: its highest
    such threshold (the fewest false hits), or None."""
    points = [p for p in sweep(scores, False, part, thresholds) if p.hit_rate >= hit_rate]
    return max(points, key=lambda p: p.threshold) if points else None


def by_kind(scores: PairScores, threshold: float, part: str | None) -> list[tuple[str, str, int, float, float]]:
    """(label, kind, number of pairs, share served with the guard, share served by cosine alone)."""
    out = []
    kinds = sorted({(p.label, p.kind) for p in scores.pairs if part is None or p.part == part})
    for label, kind in sorted(kinds, key=lambda lk: (LABELS.index(lk[0]), lk[1])):
        count = int(scores.mask(part=part, label=label, kind=kind).sum())
        guarded = scores.rate(threshold, True, part=part, label=label, kind=kind)
        alone = scores.rate(threshold, False, part=part, label=label, kind=kind)
        out.append((label, kind, count, guarded, alone))
    return out
