"""Numbered schema migrations per dialect, each applied once, recorded in `schema_migrations`.

SQLite's first migration also adopts the ledger file the proxy wrote before this schema (table
`usage` with the first 13 fields of UsageRecord; the oldest files lack `team`): its rows stay and
are counted into `usage_daily`. The runner in each dialect's module applies what is missing in
one transaction under a lock (SQLite BEGIN IMMEDIATE, a PostgreSQL advisory lock), so two
proxies starting together apply each migration once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

SQLITE_USAGE_ADDED = {
    "client_request_id": "TEXT",
    "key_id": "TEXT",
    "requested_model": "TEXT",
    "tier": "TEXT",
    "route": "TEXT",
    "score": "REAL",
    "escalated_from": "TEXT",
    "ttft_ms": "REAL",
    "is_hedge": "INTEGER NOT NULL DEFAULT 0",
    "is_shadow": "INTEGER NOT NULL DEFAULT 0",
    "hosting": "TEXT",
    "ceiling_cost_usd": "REAL",
}

_SQLITE_TABLES = """
CREATE INDEX IF NOT EXISTS usage_started_at ON usage (started_at);
CREATE INDEX IF NOT EXISTS usage_team_started_at ON usage (team, started_at);
CREATE INDEX IF NOT EXISTS usage_client_request_id ON usage (client_request_id);
CREATE TABLE usage_daily (
    day TEXT NOT NULL, team TEXT NOT NULL, model TEXT NOT NULL,
    attempts INTEGER NOT NULL, requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
    PRIMARY KEY (day, team, model)
);
INSERT INTO usage_daily
SELECT date(started_at, 'unixepoch'), COALESCE(team, ''), model, COUNT(*), SUM(attempt = 1),
       SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_usd)
FROM usage GROUP BY 1, 2, 3;
CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage BEGIN
    INSERT INTO usage_daily VALUES (
        date(NEW.started_at, 'unixepoch'), COALESCE(NEW.team, ''), NEW.model, 1, NEW.attempt = 1,
        NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd)
    ON CONFLICT (day, team, model) DO UPDATE SET
        attempts = attempts + 1, requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd;
END;
CREATE TABLE teams (
    name TEXT PRIMARY KEY, models TEXT, budget_usd_per_day REAL, budget_usd_per_month REAL,
    rpm INTEGER, tpm INTEGER, priority TEXT NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, prefix TEXT NOT NULL, digest BLOB NOT NULL UNIQUE,
    budget_usd_per_day REAL, budget_usd_per_month REAL, rpm INTEGER, tpm INTEGER,
    created_at REAL, expires_at REAL, revoked_at REAL
);
CREATE INDEX api_keys_team ON api_keys (team);
CREATE TABLE directory_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
INSERT INTO directory_version VALUES (1, 0);
"""


def _sqlite_1(db: sqlite3.Connection) -> None:
    """The usage table as the proxy wrote it, or adopted from an old file; then everything else."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS usage (request_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
        "model TEXT NOT NULL, backend TEXT NOT NULL, status TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, "
        "completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL, is_estimated INTEGER NOT NULL, "
        "started_at REAL NOT NULL, duration_ms REAL NOT NULL, error TEXT, team TEXT, "
        "PRIMARY KEY (request_id, attempt))"
    )
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    added = {"team": "TEXT"} | SQLITE_USAGE_ADDED
    for column, kind in added.items():
        if column not in present:
            db.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
    for statement in _split(_SQLITE_TABLES):
        db.execute(statement)


def _split(script: str) -> list[str]:
    """Statements of a script (a trigger's body keeps its own semicolons)."""
    statements, current = [], []
    for line in script.strip().splitlines():
        current.append(line)
        text = "\n".join(current).strip()
        if text.endswith(";") and (not text.upper().startswith("CREATE TRIGGER") or text.endswith("END;")):
            statements.append(text)
            current = []
    return statements


# The batch tier (switchyard.batch): usage rows say which batch they answered, the daily aggregate
# keeps batch requests and cost apart, and the files, batches, their lines and results.
_SQLITE_BATCH = """
ALTER TABLE usage ADD COLUMN batch_id TEXT;
ALTER TABLE usage_daily ADD COLUMN batch_requests INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN batch_cost_usd REAL NOT NULL DEFAULT 0;
DROP TRIGGER usage_daily_grows;
CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage BEGIN
    INSERT INTO usage_daily VALUES (
        date(NEW.started_at, 'unixepoch'), COALESCE(NEW.team, ''), NEW.model, 1, NEW.attempt = 1,
        NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd,
        NEW.attempt = 1 AND NEW.batch_id IS NOT NULL, CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END)
    ON CONFLICT (day, team, model) DO UPDATE SET
        attempts = attempts + 1, requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        batch_requests = batch_requests + excluded.batch_requests,
        batch_cost_usd = batch_cost_usd + excluded.batch_cost_usd;
END;
CREATE INDEX usage_batch_id ON usage (batch_id) WHERE batch_id IS NOT NULL;
CREATE TABLE batch_files (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at REAL NOT NULL, status TEXT NOT NULL
);
CREATE INDEX batch_files_team ON batch_files (team, created_at);
CREATE TABLE batch_file_parts (
    file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (file_id, seq)
);
CREATE TABLE batches (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, key_id TEXT, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, metadata TEXT, errors TEXT,
    output_file_id TEXT, error_file_id TEXT, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    in_progress_at REAL, finalizing_at REAL, completed_at REAL, failed_at REAL, expired_at REAL,
    cancelling_at REAL, cancelled_at REAL, ending TEXT, finalize_lease REAL,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX batches_team ON batches (team, created_at);
CREATE INDEX batches_status ON batches (status);
CREATE TABLE batch_lines (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, start INTEGER NOT NULL,
    length INTEGER NOT NULL, PRIMARY KEY (batch_id, line)
);
CREATE TABLE batch_results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, request_id TEXT NOT NULL,
    status_code INTEGER, body TEXT, error_code TEXT, error_message TEXT, finished_at REAL NOT NULL,
    PRIMARY KEY (batch_id, line)
);
CREATE TRIGGER batch_results_count AFTER INSERT ON batch_results BEGIN
    UPDATE batches SET
        completed = completed + (COALESCE(NEW.status_code, 0) BETWEEN 200 AND 299),
        failed = failed + NOT (COALESCE(NEW.status_code, 0) BETWEEN 200 AND 299)
    WHERE id = NEW.batch_id;
END;
"""


def _sqlite_2(db: sqlite3.Connection) -> None:
    for statement in _split(_SQLITE_BATCH):
        db.execute(statement)


# What the reports read of the cascade and of the client: each judged rung's confidence and
# threshold, and the request's own time to first byte and duration (on its answering attempt).
USAGE_ADDED_3 = ("confidence", "threshold", "request_ttfb_ms", "request_duration_ms")


def _sqlite_3(db: sqlite3.Connection) -> None:
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for column in USAGE_ADDED_3:
        if column not in present:
            db.execute(f"ALTER TABLE usage ADD COLUMN {column} REAL")


# Shadow sampling (switchyard.learning): the labelled rows, the key their prompts are hashed with,
# and shadow cost kept apart in the daily aggregate (the platform pays it, not the team).
_SQLITE_LEARNING = """
CREATE TABLE learning_rows (
    request_id TEXT PRIMARY KEY, created_at REAL NOT NULL, team TEXT, route TEXT, category TEXT,
    prompt_key TEXT, prompt TEXT, embedding BLOB, features TEXT, score REAL, routing_version TEXT,
    models TEXT, label_source TEXT, label_detail TEXT, feedback REAL, feedback_at REAL
);
CREATE INDEX learning_rows_created_at ON learning_rows (created_at);
CREATE INDEX learning_rows_team ON learning_rows (team, created_at);
CREATE TABLE learning_keys (name TEXT PRIMARY KEY, value TEXT NOT NULL);
ALTER TABLE usage_daily ADD COLUMN shadow_cost_usd REAL NOT NULL DEFAULT 0;
DROP TRIGGER usage_daily_grows;
CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage BEGIN
    INSERT INTO usage_daily VALUES (
        date(NEW.started_at, 'unixepoch'), COALESCE(NEW.team, ''), NEW.model, 1, NEW.attempt = 1,
        NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
        NEW.attempt = 1 AND NEW.batch_id IS NOT NULL, CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
        CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END)
    ON CONFLICT (day, team, model) DO UPDATE SET
        attempts = attempts + 1, requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        batch_requests = batch_requests + excluded.batch_requests,
        batch_cost_usd = batch_cost_usd + excluded.batch_cost_usd,
        shadow_cost_usd = shadow_cost_usd + excluded.shadow_cost_usd;
END;
"""


def _sqlite_4(db: sqlite3.Connection) -> None:
    for statement in _split(_SQLITE_LEARNING):
        db.execute(statement)


# The routing version (thresholds file and classifier artifact) that routed an auto or cascade
# request (switchyard.gateway.routings), for the report's comparison of versions during a rollout.
def _sqlite_5(db: sqlite3.Connection) -> None:
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    if "routing_version" not in present:
        db.execute("ALTER TABLE usage ADD COLUMN routing_version TEXT")


# Prompt caching: each attempt's prompt tokens read from and written to the upstream's prompt
# cache (NULL on older rows), summed into the daily aggregate for /v1/usage.
USAGE_ADDED_6 = ("cache_read_tokens", "cache_write_tokens")
_SQLITE_CACHE_TOKENS = """
ALTER TABLE usage_daily ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
DROP TRIGGER usage_daily_grows;
CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage BEGIN
    INSERT INTO usage_daily VALUES (
        date(NEW.started_at, 'unixepoch'), COALESCE(NEW.team, ''), NEW.model, 1, NEW.attempt = 1,
        NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
        NEW.attempt = 1 AND NEW.batch_id IS NOT NULL, CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
        CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END,
        COALESCE(NEW.cache_read_tokens, 0), COALESCE(NEW.cache_write_tokens, 0))
    ON CONFLICT (day, team, model) DO UPDATE SET
        attempts = attempts + 1, requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        batch_requests = batch_requests + excluded.batch_requests,
        batch_cost_usd = batch_cost_usd + excluded.batch_cost_usd,
        shadow_cost_usd = shadow_cost_usd + excluded.shadow_cost_usd,
        cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,
        cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens;
END;
"""


def _sqlite_6(db: sqlite3.Connection) -> None:
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for column in USAGE_ADDED_6:
        if column not in present:
            db.execute(f"ALTER TABLE usage ADD COLUMN {column} INTEGER")
    for statement in _split(_SQLITE_CACHE_TOKENS):
        db.execute(statement)


# The response cache (docs/cache.md): the answer's row says hit, miss or bypass, a hit's what it
# saved (the tokens and cost of the answer it replayed); the daily aggregate counts hits, misses
# and bypasses and sums the USD saved, for /v1/usage.
USAGE_ADDED_7 = {"response_cache": "TEXT", "response_cache_saved_tokens": "INTEGER", "response_cache_saved_usd": "REAL"}
_SQLITE_RESPONSE_CACHE = """
ALTER TABLE usage_daily ADD COLUMN response_cache_hits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN response_cache_misses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN response_cache_bypasses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN response_cache_saved_usd REAL NOT NULL DEFAULT 0;
DROP TRIGGER usage_daily_grows;
CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage BEGIN
    INSERT INTO usage_daily VALUES (
        date(NEW.started_at, 'unixepoch'), COALESCE(NEW.team, ''), NEW.model, 1, NEW.attempt = 1,
        NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
        NEW.attempt = 1 AND NEW.batch_id IS NOT NULL, CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
        CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END,
        COALESCE(NEW.cache_read_tokens, 0), COALESCE(NEW.cache_write_tokens, 0),
        COALESCE(NEW.response_cache = 'hit', 0), COALESCE(NEW.response_cache = 'miss', 0),
        COALESCE(NEW.response_cache = 'bypass', 0), COALESCE(NEW.response_cache_saved_usd, 0))
    ON CONFLICT (day, team, model) DO UPDATE SET
        attempts = attempts + 1, requests = requests + excluded.requests,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        cost_usd = cost_usd + excluded.cost_usd,
        batch_requests = batch_requests + excluded.batch_requests,
        batch_cost_usd = batch_cost_usd + excluded.batch_cost_usd,
        shadow_cost_usd = shadow_cost_usd + excluded.shadow_cost_usd,
        cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,
        cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,
        response_cache_hits = response_cache_hits + excluded.response_cache_hits,
        response_cache_misses = response_cache_misses + excluded.response_cache_misses,
        response_cache_bypasses = response_cache_bypasses + excluded.response_cache_bypasses,
        response_cache_saved_usd = response_cache_saved_usd + excluded.response_cache_saved_usd;
END;
"""


def _sqlite_7(db: sqlite3.Connection) -> None:
    present = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for column, kind in USAGE_ADDED_7.items():
        if column not in present:
            db.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
    for statement in _split(_SQLITE_RESPONSE_CACHE):
        db.execute(statement)


SQLITE: list[Callable[[sqlite3.Connection], None]] = [
    _sqlite_1,
    _sqlite_2,
    _sqlite_3,
    _sqlite_4,
    _sqlite_5,
    _sqlite_6,
    _sqlite_7,
]

POSTGRES: list[str] = [
    """
    CREATE TABLE usage (
        request_id TEXT NOT NULL, attempt INTEGER NOT NULL, model TEXT NOT NULL, backend TEXT NOT NULL,
        status TEXT NOT NULL, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL,
        cost_usd DOUBLE PRECISION NOT NULL, is_estimated BOOLEAN NOT NULL,
        started_at DOUBLE PRECISION NOT NULL, duration_ms DOUBLE PRECISION NOT NULL, error TEXT, team TEXT,
        client_request_id TEXT, key_id TEXT, requested_model TEXT, tier TEXT, route TEXT,
        score DOUBLE PRECISION, escalated_from TEXT, ttft_ms DOUBLE PRECISION,
        is_hedge BOOLEAN NOT NULL DEFAULT FALSE, is_shadow BOOLEAN NOT NULL DEFAULT FALSE,
        hosting TEXT, ceiling_cost_usd DOUBLE PRECISION,
        PRIMARY KEY (request_id, attempt)
    );
    CREATE INDEX usage_started_at ON usage (started_at);
    CREATE INDEX usage_team_started_at ON usage (team, started_at);
    CREATE INDEX usage_client_request_id ON usage (client_request_id);
    CREATE TABLE usage_daily (
        day DATE NOT NULL, team TEXT NOT NULL, model TEXT NOT NULL,
        attempts BIGINT NOT NULL, requests BIGINT NOT NULL, prompt_tokens BIGINT NOT NULL,
        completion_tokens BIGINT NOT NULL, cost_usd DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (day, team, model)
    );
    CREATE FUNCTION usage_daily_grow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO usage_daily AS d VALUES (
            (to_timestamp(NEW.started_at) AT TIME ZONE 'UTC')::date, COALESCE(NEW.team, ''), NEW.model,
            1, CASE WHEN NEW.attempt = 1 THEN 1 ELSE 0 END,
            NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd)
        ON CONFLICT (day, team, model) DO UPDATE SET
            attempts = d.attempts + 1, requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd;
        RETURN NULL;
    END $$;
    CREATE TRIGGER usage_daily_grows AFTER INSERT ON usage FOR EACH ROW EXECUTE FUNCTION usage_daily_grow();
    CREATE TABLE teams (
        name TEXT PRIMARY KEY, models TEXT, budget_usd_per_day DOUBLE PRECISION,
        budget_usd_per_month DOUBLE PRECISION, rpm INTEGER, tpm INTEGER, priority TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY, team TEXT NOT NULL, prefix TEXT NOT NULL, digest BYTEA NOT NULL UNIQUE,
        budget_usd_per_day DOUBLE PRECISION, budget_usd_per_month DOUBLE PRECISION, rpm INTEGER, tpm INTEGER,
        created_at DOUBLE PRECISION, expires_at DOUBLE PRECISION, revoked_at DOUBLE PRECISION
    );
    CREATE INDEX api_keys_team ON api_keys (team);
    CREATE TABLE directory_version (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL);
    INSERT INTO directory_version VALUES (1, 0);
    """,
    """
    ALTER TABLE usage ADD COLUMN batch_id TEXT;
    ALTER TABLE usage_daily ADD COLUMN batch_requests BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily ADD COLUMN batch_cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE OR REPLACE FUNCTION usage_daily_grow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO usage_daily AS d VALUES (
            (to_timestamp(NEW.started_at) AT TIME ZONE 'UTC')::date, COALESCE(NEW.team, ''), NEW.model,
            1, CASE WHEN NEW.attempt = 1 THEN 1 ELSE 0 END,
            NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_usd,
            CASE WHEN NEW.attempt = 1 AND NEW.batch_id IS NOT NULL THEN 1 ELSE 0 END,
            CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END)
        ON CONFLICT (day, team, model) DO UPDATE SET
            attempts = d.attempts + 1, requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            batch_requests = d.batch_requests + excluded.batch_requests,
            batch_cost_usd = d.batch_cost_usd + excluded.batch_cost_usd;
        RETURN NULL;
    END $$;
    CREATE INDEX usage_batch_id ON usage (batch_id) WHERE batch_id IS NOT NULL;
    CREATE TABLE batch_files (
        id TEXT PRIMARY KEY, team TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
        bytes BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL
    );
    CREATE INDEX batch_files_team ON batch_files (team, created_at);
    CREATE TABLE batch_file_parts (
        file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (file_id, seq)
    );
    CREATE TABLE batches (
        id TEXT PRIMARY KEY, team TEXT NOT NULL, key_id TEXT, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL, status TEXT NOT NULL, metadata TEXT, errors TEXT,
        output_file_id TEXT, error_file_id TEXT, created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, in_progress_at DOUBLE PRECISION, finalizing_at DOUBLE PRECISION,
        completed_at DOUBLE PRECISION, failed_at DOUBLE PRECISION, expired_at DOUBLE PRECISION,
        cancelling_at DOUBLE PRECISION, cancelled_at DOUBLE PRECISION, ending TEXT,
        finalize_lease DOUBLE PRECISION,
        total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX batches_team ON batches (team, created_at);
    CREATE INDEX batches_status ON batches (status);
    CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, start BIGINT NOT NULL,
        length INTEGER NOT NULL, PRIMARY KEY (batch_id, line)
    );
    CREATE TABLE batch_results (
        batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, request_id TEXT NOT NULL,
        status_code INTEGER, body TEXT, error_code TEXT, error_message TEXT,
        finished_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (batch_id, line)
    );
    CREATE FUNCTION batch_results_count() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE batches SET
            completed = completed + CASE WHEN NEW.status_code BETWEEN 200 AND 299 THEN 1 ELSE 0 END,
            failed = failed + CASE WHEN COALESCE(NEW.status_code, 0) BETWEEN 200 AND 299 THEN 0 ELSE 1 END
        WHERE id = NEW.batch_id;
        RETURN NULL;
    END $$;
    CREATE TRIGGER batch_results_count AFTER INSERT ON batch_results
        FOR EACH ROW EXECUTE FUNCTION batch_results_count();
    """,
    "".join(f"ALTER TABLE usage ADD COLUMN IF NOT EXISTS {column} DOUBLE PRECISION;\n" for column in USAGE_ADDED_3),
    """
    CREATE TABLE learning_rows (
        request_id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, team TEXT, route TEXT, category TEXT,
        prompt_key TEXT, prompt TEXT, embedding BYTEA, features TEXT, score DOUBLE PRECISION, routing_version TEXT,
        models TEXT, label_source TEXT, label_detail TEXT, feedback DOUBLE PRECISION, feedback_at DOUBLE PRECISION
    );
    CREATE INDEX learning_rows_created_at ON learning_rows (created_at);
    CREATE INDEX learning_rows_team ON learning_rows (team, created_at);
    CREATE TABLE learning_keys (name TEXT PRIMARY KEY, value TEXT NOT NULL);
    ALTER TABLE usage_daily ADD COLUMN shadow_cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE OR REPLACE FUNCTION usage_daily_grow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO usage_daily AS d VALUES (
            (to_timestamp(NEW.started_at) AT TIME ZONE 'UTC')::date, COALESCE(NEW.team, ''), NEW.model,
            1, CASE WHEN NEW.attempt = 1 THEN 1 ELSE 0 END,
            NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.attempt = 1 AND NEW.batch_id IS NOT NULL THEN 1 ELSE 0 END,
            CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END)
        ON CONFLICT (day, team, model) DO UPDATE SET
            attempts = d.attempts + 1, requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            batch_requests = d.batch_requests + excluded.batch_requests,
            batch_cost_usd = d.batch_cost_usd + excluded.batch_cost_usd,
            shadow_cost_usd = d.shadow_cost_usd + excluded.shadow_cost_usd;
        RETURN NULL;
    END $$;
    """,
    "ALTER TABLE usage ADD COLUMN IF NOT EXISTS routing_version TEXT;",  # number 5: see _sqlite_5
    "".join(f"ALTER TABLE usage ADD COLUMN IF NOT EXISTS {column} BIGINT;\n" for column in USAGE_ADDED_6)
    + """
    ALTER TABLE usage_daily ADD COLUMN cache_read_tokens BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0;
    CREATE OR REPLACE FUNCTION usage_daily_grow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO usage_daily AS d VALUES (
            (to_timestamp(NEW.started_at) AT TIME ZONE 'UTC')::date, COALESCE(NEW.team, ''), NEW.model,
            1, CASE WHEN NEW.attempt = 1 THEN 1 ELSE 0 END,
            NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.attempt = 1 AND NEW.batch_id IS NOT NULL THEN 1 ELSE 0 END,
            CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END,
            COALESCE(NEW.cache_read_tokens, 0), COALESCE(NEW.cache_write_tokens, 0))
        ON CONFLICT (day, team, model) DO UPDATE SET
            attempts = d.attempts + 1, requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            batch_requests = d.batch_requests + excluded.batch_requests,
            batch_cost_usd = d.batch_cost_usd + excluded.batch_cost_usd,
            shadow_cost_usd = d.shadow_cost_usd + excluded.shadow_cost_usd,
            cache_read_tokens = d.cache_read_tokens + excluded.cache_read_tokens,
            cache_write_tokens = d.cache_write_tokens + excluded.cache_write_tokens;
        RETURN NULL;
    END $$;
    """,
    """ALTER TABLE usage ADD COLUMN IF NOT EXISTS response_cache TEXT;
    ALTER TABLE usage ADD COLUMN IF NOT EXISTS response_cache_saved_tokens BIGINT;
    ALTER TABLE usage ADD COLUMN IF NOT EXISTS response_cache_saved_usd DOUBLE PRECISION;
    ALTER TABLE usage_daily ADD COLUMN response_cache_hits BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily ADD COLUMN response_cache_misses BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily ADD COLUMN response_cache_bypasses BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE usage_daily ADD COLUMN response_cache_saved_usd DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE OR REPLACE FUNCTION usage_daily_grow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO usage_daily AS d VALUES (
            (to_timestamp(NEW.started_at) AT TIME ZONE 'UTC')::date, COALESCE(NEW.team, ''), NEW.model,
            1, CASE WHEN NEW.attempt = 1 THEN 1 ELSE 0 END,
            NEW.prompt_tokens, NEW.completion_tokens, CASE WHEN NEW.is_shadow THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.attempt = 1 AND NEW.batch_id IS NOT NULL THEN 1 ELSE 0 END,
            CASE WHEN NEW.batch_id IS NULL THEN 0 ELSE NEW.cost_usd END,
            CASE WHEN NEW.is_shadow THEN NEW.cost_usd ELSE 0 END,
            COALESCE(NEW.cache_read_tokens, 0), COALESCE(NEW.cache_write_tokens, 0),
            CASE WHEN NEW.response_cache = 'hit' THEN 1 ELSE 0 END,
            CASE WHEN NEW.response_cache = 'miss' THEN 1 ELSE 0 END,
            CASE WHEN NEW.response_cache = 'bypass' THEN 1 ELSE 0 END,
            COALESCE(NEW.response_cache_saved_usd, 0))
        ON CONFLICT (day, team, model) DO UPDATE SET
            attempts = d.attempts + 1, requests = d.requests + excluded.requests,
            prompt_tokens = d.prompt_tokens + excluded.prompt_tokens,
            completion_tokens = d.completion_tokens + excluded.completion_tokens,
            cost_usd = d.cost_usd + excluded.cost_usd,
            batch_requests = d.batch_requests + excluded.batch_requests,
            batch_cost_usd = d.batch_cost_usd + excluded.batch_cost_usd,
            shadow_cost_usd = d.shadow_cost_usd + excluded.shadow_cost_usd,
            cache_read_tokens = d.cache_read_tokens + excluded.cache_read_tokens,
            cache_write_tokens = d.cache_write_tokens + excluded.cache_write_tokens,
            response_cache_hits = d.response_cache_hits + excluded.response_cache_hits,
            response_cache_misses = d.response_cache_misses + excluded.response_cache_misses,
            response_cache_bypasses = d.response_cache_bypasses + excluded.response_cache_bypasses,
            response_cache_saved_usd = d.response_cache_saved_usd + excluded.response_cache_saved_usd;
        RETURN NULL;
    END $$;
    """,
]
