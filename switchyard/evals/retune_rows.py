"""The labelled rows `switchyard eval retune` reads: from a trace file or the ledger's database, in
the labelled-rows layout (evals/TRACE_FORMAT.md), checked, and split by time."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from switchyard.classifier.embedder import EMBEDDING_DIM
from switchyard.classifier.features import FEATURE_NAMES
from switchyard.core.traces import Trace, read_traces
from switchyard.evals.evaluate import EvalError

DEFAULT_LEDGER_WINDOW = "7d"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(value: str, now: float | None = None) -> float:
    """`7d`, `36h`, `90m`, `2w` before now, or a UTC date or time (`2026-11-01`, `2026-11-01T12:00`),
    as unix seconds."""
    now = time.time() if now is None else now
    match = _DURATION.match(value)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        moment = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise EvalError(f"--since {value!r} is neither a duration (7d, 36h, 90m, 2w) nor a date (2026-11-01)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def read_trace_rows(path: Path) -> list[Trace]:
    """Labelled rows from a trace file (a `TraceFormatError` when it is not one)."""
    return read_traces(path)[0]


def read_ledger_rows(database_url: str | None, since: float) -> list[Trace]:
    """Labelled rows from the ledger's database (`switchyard.learning.rows`), oldest first."""
    import asyncio

    if database_url is None:
        raise EvalError("the config has no ledger (billing.ledger_path and billing.database_url are null)")
    from switchyard.billing.store.base import open_database
    from switchyard.learning.rows import labelled_traces

    async def read() -> list[Trace]:
        database = await open_database(database_url)
        try:
            return await labelled_traces(database, since=since)
        finally:
            await database.aclose()

    return asyncio.run(read())


@dataclass(frozen=True, slots=True)
class TimedRows:
    """Rows with both models' outcomes, oldest first, split at `cut`: fit before it, report after."""

    rows: list[Trace]
    cut: int

    @property
    def fit(self) -> list[Trace]:
        return self.rows[: self.cut]

    @property
    def held_out(self) -> list[Trace]:
        return self.rows[self.cut :]


def paired_rows(traces: Sequence[Trace], weak: str, strong: str, since: float | None) -> list[Trace]:
    """The rows graded for both models (a feedback-only row has one), created at or after `since`,
    oldest first."""
    if not traces:
        raise EvalError("no labelled rows" + (" in the window" if since is not None else ""))
    for trace in traces:
        created = trace.extra.get("created_at")
        if not isinstance(created, int | float) or isinstance(created, bool):
            raise EvalError(f"row {trace.id!r} has no created_at (unix seconds): re-tuning splits rows by time")
    chosen = [
        t
        for t in traces
        if weak in t.models and strong in t.models and (since is None or t.extra["created_at"] >= since)
    ]
    if not chosen:
        raise EvalError(
            f"none of the {len(traces)} labelled rows grades both {weak!r} and {strong!r}"
            + (" in the window" if since is not None else "")
        )
    return sorted(chosen, key=lambda t: float(t.extra["created_at"]))


def split_by_time(rows: list[Trace], holdout: float, min_rows: int = 10) -> TimedRows:
    """The newest `holdout` share held out; both parts at least `min_rows`."""
    cut = len(rows) - int(round(len(rows) * holdout))
    if cut < min_rows or len(rows) - cut < min_rows:
        raise EvalError(
            f"{len(rows)} rows grade both models: too few to fit on {1 - holdout:.0%} and report on "
            f"{holdout:.0%} (each part needs {min_rows})"
        )
    return TimedRows(rows, cut)


def resolve_pair(traces: Sequence[Trace], weak: str | None, strong: str | None) -> tuple[str, str]:
    """Weak and strong as given, else the two models the rows grade, the cheaper per output token weak."""
    if weak and strong:
        return weak, strong
    names = sorted({name for t in traces for name in t.models})
    if len(names) != 2:
        raise EvalError(f"the rows grade {len(names)} models ({', '.join(names)}); name them with --weak and --strong")

    def price(name: str) -> float:
        outcomes = [t.models[name] for t in traces if name in t.models]
        return sum(o.cost_usd for o in outcomes) / max(1, sum(o.output_tokens for o in outcomes))

    cheap, dear = sorted(names, key=price)
    return weak or cheap, strong or dear


def embedded_rows(rows: Sequence[Trace]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which rows carry the classifier's embedding and features, and those as matrices (rows of
    `EMBEDDING_DIM` and of `FEATURE_NAMES`). A malformed embedding or features is an error."""
    has = np.array([t.extra.get("embedding") is not None and t.extra.get("features") is not None for t in rows])
    embeddings = np.zeros((int(has.sum()), EMBEDDING_DIM))
    features = np.zeros((int(has.sum()), len(FEATURE_NAMES)))
    for i, trace in enumerate(t for t, ok in zip(rows, has, strict=True) if ok):
        embedding, named = trace.extra["embedding"], trace.extra["features"]
        if not isinstance(embedding, list) or len(embedding) != EMBEDDING_DIM:
            size = len(embedding) if isinstance(embedding, list) else type(embedding).__name__
            raise EvalError(f"row {trace.id!r}: embedding must be {EMBEDDING_DIM} numbers, not {size}")
        missing = [name for name in FEATURE_NAMES if not isinstance(named, dict) or name not in named]
        if missing:
            raise EvalError(f"row {trace.id!r}: features lack {', '.join(missing)}")
        try:
            embeddings[i] = np.asarray(embedding, dtype=np.float64)
            features[i] = [float(named[name]) for name in FEATURE_NAMES]
        except (TypeError, ValueError) as exc:
            raise EvalError(f"row {trace.id!r}: embedding and features must be numbers ({exc})") from exc
    return has, embeddings, features
