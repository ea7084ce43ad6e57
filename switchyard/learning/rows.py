"""The learning rows: one per shadowed request (and per request a client scored), in the ledger's
database (table `learning_rows`, migration 4 of billing/store/migrations.py).

A row keeps what re-tuning needs and nothing more: who asked (team, route), when, a keyed hash of
the prompt (HMAC-SHA256, `prompt_key`), the classifier's embedding and features of the text it
scored, its score, each model's outcome (cost, tokens, the weak side's logprobs and confidence),
the label and the client's feedback. The prompt's text only with `shadow.store_prompts: true`.
`labelled_traces()` reads them back in the trace layout `switchyard eval retune` reads.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from switchyard.billing.store import Database
from switchyard.classifier.features import FEATURE_NAMES
from switchyard.core.traces import ModelOutcome, Trace

HASH_KEY_NAME = "prompt_hash_key"
_COLUMNS = (
    "request_id, created_at, team, route, category, prompt_key, prompt, embedding, features, score, "
    "routing_version, models, label_source, label_detail, feedback, feedback_at"
)
_MARKS = ", ".join("?" * len(_COLUMNS.split(", ")))


@dataclass(slots=True)
class LearningRow:
    request_id: str
    created_at: float  # unix s of the client's request
    team: str | None
    route: str | None  # auto | cascade
    prompt_key: str
    models: dict[str, dict[str, Any]]  # model -> quality?, cost_usd, output_tokens, token_logprobs?, confidence?
    prompt: str | None = None  # only with store_prompts
    embedding: np.ndarray | None = None  # float32, the classifier's embedding of the text it scored
    features: dict[str, float] | None = None
    score: float | None = None
    routing_version: str | None = None
    label_source: str | None = None  # verifiable | judge (feedback: a feedback-only row)
    label_detail: str | None = None
    feedback: float | None = None
    feedback_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def values(self) -> tuple[Any, ...]:
        embedding = self.embedding.astype(np.float32).tobytes() if self.embedding is not None else None
        return (
            self.request_id,
            self.created_at,
            self.team,
            self.route,
            self.route,
            self.prompt_key,
            self.prompt,
            embedding,
            orjson.dumps(self.features).decode() if self.features is not None else None,
            self.score,
            self.routing_version,
            orjson.dumps(self.models).decode(),
            self.label_source,
            self.label_detail,
            self.feedback,
            self.feedback_at,
        )


def features_of(text: str) -> dict[str, float]:
    from switchyard.classifier.features import prompt_features

    return dict(zip(FEATURE_NAMES, prompt_features(text), strict=True))


def prompt_key(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


async def hash_key(database: Database, configured: str | None) -> bytes:
    """`shadow.hash_key`, else this installation's random key, made once and kept in the database."""
    if configured:
        return configured.encode()
    await database.execute(
        "INSERT INTO learning_keys (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        HASH_KEY_NAME,
        secrets.token_hex(32),
    )
    ((value,),) = await database.fetch("SELECT value FROM learning_keys WHERE name = ?", HASH_KEY_NAME)
    return bytes.fromhex(value)


async def insert_row(database: Database, row: LearningRow) -> None:
    """The row; a client's feedback that arrived first is kept on it."""
    await database.execute(
        f"INSERT INTO learning_rows ({_COLUMNS}) VALUES ({_MARKS}) ON CONFLICT (request_id) DO UPDATE SET "
        "created_at = excluded.created_at, team = excluded.team, route = excluded.route, "
        "category = excluded.category, prompt_key = excluded.prompt_key, prompt = excluded.prompt, "
        "embedding = excluded.embedding, features = excluded.features, score = excluded.score, "
        "routing_version = excluded.routing_version, models = excluded.models, "
        "label_source = excluded.label_source, label_detail = excluded.label_detail",
        *row.values(),
    )


async def store_feedback(
    database: Database,
    request_id: str,
    score: float,
    *,
    team: str | None,
    created_at: float,
    answered: dict[str, dict[str, Any]],
) -> None:
    """The client's score on the request's row; a feedback-only row (`answered`: the answering
    model's cost and tokens) when the request was not shadowed."""
    now = time.time()
    models = orjson.dumps(answered).decode()
    await database.execute(
        "INSERT INTO learning_rows (request_id, created_at, team, models, feedback, feedback_at) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE SET "
        "feedback = excluded.feedback, feedback_at = excluded.feedback_at",
        request_id,
        created_at,
        team,
        models,
        score,
        now,
    )


async def delete_rows(database: Database, *, team: str | None = None, before: float | None = None) -> int:
    """Delete a team's rows, or those created before `before` (unix s); returns how many."""
    if team is not None:
        return await database.execute("DELETE FROM learning_rows WHERE team = ?", team)
    assert before is not None
    return await database.execute("DELETE FROM learning_rows WHERE created_at < ?", before)


async def read_rows(database: Database, *, since: float | None = None) -> list[LearningRow]:
    rows = await database.fetch(
        f"SELECT {_COLUMNS} FROM learning_rows WHERE created_at >= ? ORDER BY created_at, request_id",
        since if since is not None else float("-inf"),
    )
    return [_row(values) for values in rows]


async def judged_answers(
    database: Database, *, since: float | None = None, until: float | None = None
) -> dict[str, float]:
    """Request id -> the quality of the answer its client got (0..1): the label's for the model that
    answered, else the client's own score (`POST /v1/feedback`); rows with neither are left out.
    What the report's routing versions join by request id."""
    rows = await database.fetch(
        "SELECT request_id, models, feedback FROM learning_rows WHERE created_at >= ? AND created_at < ?",
        since if since is not None else float("-inf"),
        until if until is not None else float("inf"),
    )
    judged: dict[str, float] = {}
    for request_id, models, feedback in rows:
        outcomes = orjson.loads(models) if models else {}
        quality = next((o.get("quality") for o in outcomes.values() if o.get("answered")), None)
        if quality is None:
            quality = feedback
        if quality is not None:
            judged[request_id] = float(quality)
    return judged


def _row(values: tuple[Any, ...]) -> LearningRow:
    (
        request_id,
        created_at,
        team,
        route,
        _category,
        key,
        prompt,
        embedding,
        features,
        score,
        version,
        models,
        source,
        detail,
        feedback,
        feedback_at,
    ) = values
    return LearningRow(
        request_id=request_id,
        created_at=float(created_at),
        team=team,
        route=route,
        prompt_key=key or "",
        models=orjson.loads(models) if models else {},
        prompt=prompt,
        embedding=np.frombuffer(bytes(embedding), dtype=np.float32) if embedding is not None else None,
        features=orjson.loads(features) if features else None,
        score=score,
        routing_version=version,
        label_source=source,
        label_detail=detail,
        feedback=feedback,
        feedback_at=feedback_at,
    )


def as_trace(row: LearningRow) -> Trace | None:
    """The row in the labelled-rows trace layout (None: neither a label nor a client's score)."""
    if row.label_source is not None:
        source = row.label_source
        models = {name: _outcome(outcome, outcome.get("quality")) for name, outcome in row.models.items()}
        if any(outcome is None for outcome in models.values()):
            return None
    elif row.feedback is not None and row.models:
        source = "feedback"
        models = {name: _outcome(outcome, row.feedback) for name, outcome in row.models.items()}
    else:
        return None
    extra: dict[str, Any] = {
        "created_at": row.created_at,
        "team": row.team,
        "prompt_key": row.prompt_key,
        "embedding": [float(x) for x in row.embedding] if row.embedding is not None else None,
        "features": row.features,
        "score": row.score,
        "routing_version": row.routing_version,
        "label_source": source,
    }
    if row.feedback is not None:
        extra["feedback"] = row.feedback
    return Trace(
        id=row.request_id,
        prompt=row.prompt or "",
        category=row.route or "auto",
        split="train",
        models={name: outcome for name, outcome in models.items() if outcome is not None},
        extra=extra,
    )


def _outcome(raw: dict[str, Any], quality: Any) -> ModelOutcome | None:
    if quality is None:
        return None
    known = {"quality", "cost_usd", "output_tokens", "token_logprobs", "top_logprobs"}
    return ModelOutcome(
        quality=float(quality),
        cost_usd=float(raw.get("cost_usd") or 0.0),
        output_tokens=int(raw.get("output_tokens") or 0),
        token_logprobs=raw.get("token_logprobs"),
        top_logprobs=raw.get("top_logprobs"),
        extra={k: v for k, v in raw.items() if k not in known},
    )


async def labelled_traces(database: Database, *, since: float | None = None) -> list[Trace]:
    """Every labelled (or client-scored) row created at or after `since` (unix s), oldest first."""
    return [trace for row in await read_rows(database, since=since) if (trace := as_trace(row)) is not None]
