"""The trace format every eval reads: JSONL, one prompt per line (version 1).

    {"id": str, "prompt": str, "category": str, "split": "train" | "test",
     "models": {"<model>": {"quality": 0..1, "cost_usd": float, "output_tokens": int,
                            "token_logprobs": [float]?, "top_logprobs": [[{"token", "logprob"}]]?}}}

A file may start with a header line `{"switchyard_trace_format": 1, ...}` carrying metadata
(source, notes such as estimated token counts); files without one are read as version 1. Model
entries and traces may carry more keys (kept in their `extra`). See evals/TRACE_FORMAT.md.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson

TRACE_FORMAT_VERSION = 1
HEADER_KEY = "switchyard_trace_format"
SPLITS = ("train", "test")


class TraceFormatError(ValueError):
    """A trace file does not follow the format; the message names the file and line."""


@dataclass(slots=True)
class ModelOutcome:
    quality: float
    cost_usd: float
    output_tokens: int
    token_logprobs: list[float] | None = None
    top_logprobs: list[list[dict[str, Any]]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"quality": self.quality, "cost_usd": self.cost_usd, "output_tokens": self.output_tokens}
        if self.token_logprobs is not None:
            out["token_logprobs"] = self.token_logprobs
        if self.top_logprobs is not None:
            out["top_logprobs"] = self.top_logprobs
        return {**out, **self.extra}


@dataclass(slots=True)
class Trace:
    id: str
    prompt: str
    category: str
    split: str
    models: dict[str, ModelOutcome]
    extra: dict[str, Any] = field(default_factory=dict)  # further top-level keys, kept as read

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.extra,
            "id": self.id,
            "prompt": self.prompt,
            "category": self.category,
            "split": self.split,
            "models": {name: outcome.to_dict() for name, outcome in self.models.items()},
        }


def _outcome(raw: Any, where: str) -> ModelOutcome:
    if not isinstance(raw, dict):
        raise TraceFormatError(f"{where}: a model entry must be an object")
    try:
        quality = float(raw["quality"])
        cost_usd = float(raw["cost_usd"])
        output_tokens = int(raw["output_tokens"])
    except KeyError as exc:
        raise TraceFormatError(f"{where}: missing '{exc.args[0]}'") from exc
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(f"{where}: {exc}") from exc
    if not 0.0 <= quality <= 1.0:
        raise TraceFormatError(f"{where}: quality {quality} is outside 0..1")
    token_logprobs = raw.get("token_logprobs")
    if token_logprobs is not None and not all(isinstance(x, int | float) for x in token_logprobs):
        raise TraceFormatError(f"{where}: token_logprobs must be a list of numbers")
    known = {"quality", "cost_usd", "output_tokens", "token_logprobs", "top_logprobs"}
    return ModelOutcome(
        quality=quality,
        cost_usd=cost_usd,
        output_tokens=output_tokens,
        token_logprobs=[float(x) for x in token_logprobs] if token_logprobs is not None else None,
        top_logprobs=raw.get("top_logprobs"),
        extra={k: v for k, v in raw.items() if k not in known},
    )


_TRACE_KEYS = frozenset({"id", "prompt", "category", "split", "models"})


def trace_from_dict(raw: Any, where: str = "trace") -> Trace:
    if not isinstance(raw, dict):
        raise TraceFormatError(f"{where}: a trace must be a JSON object")
    missing = [key for key in ("id", "prompt", "models") if key not in raw]
    if missing:
        raise TraceFormatError(f"{where}: missing {', '.join(repr(k) for k in missing)}")
    split = raw.get("split", "test")
    if split not in SPLITS:
        raise TraceFormatError(f"{where}: split must be one of {SPLITS}, not {split!r}")
    if not isinstance(raw["models"], dict) or not raw["models"]:
        raise TraceFormatError(f"{where}: 'models' must be a non-empty object")
    return Trace(
        id=str(raw["id"]),
        prompt=str(raw["prompt"]),
        category=str(raw.get("category") or "all"),
        split=split,
        models={str(name): _outcome(entry, f"{where}: model {name!r}") for name, entry in raw["models"].items()},
        extra={k: v for k, v in raw.items() if k not in _TRACE_KEYS},
    )


def _open(path: Path, mode: Literal["rb", "wb"]) -> gzip.GzipFile | BinaryIO:
    return gzip.open(path, mode) if path.suffix == ".gz" else path.open(mode)


def read_traces(path: str | Path) -> tuple[list[Trace], dict[str, Any]]:
    """The traces in `path` (`.jsonl` or `.jsonl.gz`) and the header's metadata ({} if none)."""
    path = Path(path)
    traces: list[Trace] = []
    header: dict[str, Any] = {}
    try:
        handle = _open(path, "rb")
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror}") from exc
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                raw = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise TraceFormatError(f"{where}: not JSON ({exc})") from exc
            if isinstance(raw, dict) and HEADER_KEY in raw:
                if raw[HEADER_KEY] != TRACE_FORMAT_VERSION:
                    raise TraceFormatError(
                        f"{where}: trace format version {raw[HEADER_KEY]!r} is not understood "
                        f"(this Switchyard reads version {TRACE_FORMAT_VERSION})"
                    )
                header = raw
                continue
            traces.append(trace_from_dict(raw, where))
    if not traces:
        raise TraceFormatError(f"{path}: no traces")
    return traces, header


def write_traces(path: str | Path, traces: Iterable[Trace], **meta: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "wb") as handle:
        handle.write(orjson.dumps({HEADER_KEY: TRACE_FORMAT_VERSION, **meta}) + b"\n")
        for trace in traces:
            handle.write(orjson.dumps(trace.to_dict()) + b"\n")


def traces_digest(traces: Iterable[Trace]) -> str:
    """A hash of the traces' content, recorded in threshold files to name the data they came from."""
    digest = hashlib.sha256()
    for trace in traces:
        digest.update(orjson.dumps(trace.to_dict(), option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()
