"""Configuration: one YAML file plus `SWITCHYARD__*` environment overrides.

Phase one is here: raw settings, read and validated, unknown keys rejected with a message naming
the key. Phase two (`switchyard.gateway.services.build_services`) turns them into runtime objects.
Each model is one class per `backend` (a discriminated union), with only that backend's fields:
those are in `switchyard.core.model_settings`.
The built-in default config and `load_settings()` live in `switchyard.backends.defaults`.

    SWITCHYARD__SERVER__PORT=9000             -> server.port
    SWITCHYARD__MODELS='[{"name": ...}]'      -> models (JSON for lists)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from switchyard.core.body_limits import BodyLimits
from switchyard.core.cache_settings import CacheMode, CacheSettings
from switchyard.core.model_settings import BACKEND_KINDS, ModelSettings, StrictModel
from switchyard.core.thresholds import CONFIDENCE_FEATURES

DEFAULT_CONFIG_NAME = "switchyard.yaml"
# Picked by `switchyard classifier train` on the train split and shipped with the classifier.


RESERVED_MODEL_NAMES = ("auto", "cascade")
VALKEY_OFF = "none"  # billing.redis_url that turns Valkey off (left out, `serve` starts a private one)


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the key."""


class ServerSettings(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    body_timeout_s: float = Field(default=30.0, gt=0)  # the whole body must arrive within this, else a 400
    # What a body under max_body_bytes may hold (core/body_limits.py); over any of them is a 400.
    # The depth stays under 254, where orjson stops writing the body back out.
    max_json_depth: int = Field(default=64, ge=4, le=200)  # the body is level 1
    max_messages: int = Field(default=2048, ge=1)  # in one chat request
    max_prompt_chars: int = Field(default=2_000_000, ge=1)  # the messages' text, or a completions prompt (batch)
    max_prompt_token_ids: int = Field(default=262_144, ge=1)  # a completions prompt (batch) given as token ids
    # The connection edge (proxy/edge.py): limits enforced before a request reaches the app.
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)  # request line + headers; larger is a 431
    header_timeout_s: float = Field(default=10.0, gt=0)  # to send a request head, from connect or the last response
    keepalive_timeout_s: float = Field(default=5.0, gt=0)  # an idle keep-alive connection is closed after this
    max_connections: int = Field(default=4096, ge=1)  # open client connections; also kept under the open-file limit
    # Worker processes on the one port (`serve --workers` wins); over 1 needs Valkey (not redis_url: none).
    # max_connections and the open-file reserve apply to each worker.
    workers: int = Field(default=1, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = False  # uvicorn's line per request; credentials in query strings masked
    # /metrics: open while the config has no key at all (no auth.admin_key, no team); once it has
    # one, the scrape needs `Authorization: Bearer <metrics_token>` (or the admin key);
    # metrics_public: true keeps it open (a trusted network)
    metrics_token: SecretStr | None = None
    metrics_public: bool = False
    # /health/ready answers 200 when every model is ready (`all`), or as soon as one is (`any`)
    ready_when: Literal["all", "any"] = "all"
    # Browser origins that may call the API (CORS, preflight included), e.g. [https://app.example.com]
    # or ["*"]; empty: no CORS headers, so browsers refuse to read the answers.
    cors_origins: list[str] = Field(default_factory=list)

    def body_limits(self) -> BodyLimits:
        return BodyLimits(self.max_json_depth, self.max_messages, self.max_prompt_chars, self.max_prompt_token_ids)


class UpstreamSettings(StrictModel):
    """The one pooled HTTP session every HTTP backend shares."""

    max_connections: int = Field(default=1024, ge=1)
    # Below the 5 s keep-alive of uvicorn-based servers (vLLM among them), so the pool drops an idle
    # connection before the server does.
    keepalive_expiry_s: float = Field(default=4.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=300.0, gt=0)
    # A stream's longest silence between two reads once it started (non-stream requests too, asked
    # as streams unless their model sets assemble_from_stream: false); a stall ends here.
    stream_idle_timeout_s: float = Field(default=30.0, gt=0)
    health_interval_s: float = Field(default=10.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)


class AutoRoutingSettings(StrictModel):
    """`model="auto"`: tiers in ascending order; the classifier picks one (see proxy/routing.py)."""

    tiers: list[str] = Field(default_factory=list)  # e.g. [small, large, commercial]; empty: no "auto"
    thresholds: list[float] | None = None  # len(tiers) - 1, used when there is no thresholds file
    default_tier: str | None = None  # when the classifier is late or fails; default: the first tier
    deadline_ms: float = Field(default=50.0, gt=0)
    classifier_artifact: Path | None = None  # default: the artifact shipped in classifier/artifacts
    max_batch: int = Field(default=32, ge=1)
    max_wait_ms: float = Field(default=0.0, ge=0)  # wait for company when the worker is idle
    cache_size: int = Field(default=10_000, ge=0)
    threads: int | None = Field(default=1, ge=1)  # torch threads for the embedding model
    warm_up: bool = True  # load the classifier at start (else at the first auto request)
    read_system_prompt: bool = True  # the classifier reads the system prompt(s) before the last user turn
    # Routing by value (classifier/by_value.py): tier -> the model the artifact predicts its quality
    # as; default: the thresholds file's `routing.by_value`, else routing by score thresholds.
    quality_models: dict[str, str] | None = None
    # quality mode -> how far below the best tier's predicted quality a cheaper tier may be;
    # default: the thresholds file's, else classifier.by_value.DEFAULT_TOLERANCES
    tolerance: dict[Literal["economy", "balanced", "max"], Annotated[float, Field(ge=0, le=1)]] | None = None

    @model_validator(mode="after")
    def _default_in_tiers(self) -> AutoRoutingSettings:
        if self.default_tier is not None and self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of tiers {self.tiers}")
        if self.quality_models is not None and set(self.quality_models) != set(self.tiers):
            raise ValueError(
                f"quality_models must name a model for each tier ({', '.join(self.tiers)}), "
                f"not for {', '.join(self.quality_models) or 'none'}"
            )
        return self


class TeamSettings(StrictModel):
    """A team: its API keys, the models it may use, its budgets, limits and priority (billing/teams.py)."""

    api_keys: list[SecretStr] = Field(min_length=1)
    models: list[str] | None = None  # model names it may use, directly or through auto/cascade; null: all
    budget_usd_per_day: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)  # per UTC day
    budget_usd_per_month: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)  # per UTC month
    rpm: int | None = Field(default=None, ge=1, le=2**31 - 1)  # requests per minute; null: no limit
    tpm: int | None = Field(default=None, ge=1, le=2**31 - 1)  # tokens (prompt + max_tokens) per minute
    priority: str = "interactive"  # interactive | batch | a name in billing.priority_tiers
    # adapters (by name) that `auto` applies when it routes this team to their base model
    default_adapters: list[str] = Field(default_factory=list)
    cache: CacheMode | None = None  # the response cache's mode for this team; null: cache.mode and routes


class AuthSettings(StrictModel):
    admin_key: SecretStr | None = None  # enables /admin; null: /admin answers 401 to everyone


class LoggingSettings(StrictModel):
    """The request log: one line per API request, written when it ends (`switchyard.requests`)."""

    requests: bool = True  # false: no request log
    format: Literal["json", "text"] = "json"  # json: one object a line; text: key=value pairs
    prompts: bool = False  # true: the line carries the request's messages or prompt (they may be private)


class TracingSettings(StrictModel):
    """OpenTelemetry spans (core/tracing.py): off unless `otlp_endpoint` is set."""

    otlp_endpoint: str | None = None  # OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces
    service_name: str = "switchyard"
    sample_ratio: float = Field(default=1.0, ge=0, le=1)  # of traces started here; a client's sampled flag wins


class PriorityTierSettings(StrictModel):
    """A named priority: how its requests meet saturation, and caps on what they may ask."""

    saturation: Literal["best-effort", "standard", "priority"] = "standard"
    max_tokens: int | None = Field(default=None, ge=1)  # cap on the answer length asked for
    context_tokens: int | None = Field(default=None, ge=1)  # cap on prompt + max_tokens
    max_concurrency: int | None = Field(default=None, ge=1)  # requests at once, per proxy process


class BillingSettings(StrictModel):
    ledger_path: Path | None = Path("~/.cache/switchyard/usage.sqlite3")  # null (and no database_url): no ledger
    database_url: str | None = None  # sqlite:///./file.db or postgresql://user:pw@host/db; wins over ledger_path
    # redis://host:6379/0: the batch queue, and budgets and rate limits shared by every replica; left
    # out: `serve` starts a private Valkey (billing/private_valkey.py); "none": no Valkey at all
    redis_url: str | None = None
    fail_open: bool = False  # Valkey/Redis unreachable: refuse (503, the default) or let requests through
    spill_path: Path = Path("~/.cache/switchyard/ledger-spill.jsonl")  # records kept while the database is down
    reservation_ttl_s: float = Field(default=900.0, gt=0)  # a reservation a crashed replica left is freed after
    priority_tiers: dict[str, PriorityTierSettings] = Field(default_factory=dict)

    def valkey_url(self) -> str | None:
        """The Valkey (or Redis) the settings name: `redis_url`, unless it is left out or "none"."""
        if not self.redis_url or self.is_valkey_off():
            return None
        return self.redis_url

    def is_valkey_off(self) -> bool:
        """`redis_url: none`: no Valkey, not even a private one."""
        return (self.redis_url or "").lower() == VALKEY_OFF

    def resolved_database_url(self) -> str | None:
        """`database_url`, else the SQLite file at `ledger_path`, else None (no ledger)."""
        if self.database_url is not None:
            return self.database_url
        return f"sqlite:///{self.ledger_path}" if self.ledger_path is not None else None


class BatchSettings(StrictModel):
    """The batch tier (switchyard.batch): the OpenAI Batch API on a Valkey Streams queue
    (`billing.redis_url`), its files in the database (or `files_dir`)."""

    run_in_proxy: bool = True  # each proxy drains batches with what its interactive traffic leaves
    concurrency: int = Field(default=4, ge=1)  # lines one process runs at once
    yield_at_in_flight: int = Field(default=16, ge=1)  # interactive requests in this process that pause it
    yield_at_cpu: float = Field(default=0.6, gt=0, le=1)  # … or its CPU (share of a core), while any run
    price_factor: float = Field(default=0.5, ge=0)  # a line pays this share of its model's price
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)  # an upload (OpenAI's limit: 200 MB)
    max_lines: int = Field(default=50_000, ge=1)  # in one batch's input file (OpenAI's limit)
    window_s: float = Field(default=86_400.0, gt=0)  # what completion_window "24h" gives a batch
    claim_after_s: float = Field(default=60.0, gt=0)  # a line its worker stopped tending is run elsewhere
    files_dir: Path | None = None  # the files' contents here (shared by every proxy) instead of the database


class RoutingSettings(StrictModel):
    thresholds_file: Path | None = None  # written by `switchyard eval thresholds`; read at start
    auto: AutoRoutingSettings = Field(default_factory=AutoRoutingSettings)


class RolloutSettings(StrictModel):
    """A candidate routing version answering a share of `auto` and `cascade` requests beside the
    current one (docs/learning.md): its thresholds file, and its classifier artifact when it has
    its own. A candidate file that does not exist (after `switchyard rollout promote`) is no rollout."""

    candidate: Path | None = None
    candidate_artifact: Path | None = None  # default: routing.auto.classifier_artifact
    share: float = Field(default=0.0, ge=0, le=1)  # by a hash of the request id

    @model_validator(mode="after")
    def _needs_candidate(self) -> RolloutSettings:
        if self.candidate is None and (self.candidate_artifact is not None or self.share > 0):
            raise ValueError("candidate_artifact and share need candidate (the candidate's thresholds file)")
        return self


class ThrashSettings(StrictModel):
    """The thrash guard (see cascade/thrash.py)."""

    window: int = Field(default=50, ge=1)  # judged requests per route kept
    min_requests: int = Field(default=20, ge=1)  # before the guard may trip
    limit: float = Field(default=0.6, gt=0, le=1)  # escalation share that trips it
    cool_off_s: float = Field(default=60.0, gt=0)  # how long the route starts one rung higher


class CascadeSettings(StrictModel):
    """Escalate on low token-logprob confidence (see cascade/runtime.py).

    `model="cascade"` starts at the first rung; `model="auto"` starts where the classifier routes
    it, when that model is a rung. A thresholds file's `cascade` section (written by `switchyard
    eval cascade`) sets the scorer and threshold of the rungs it names; the others use
    `scorer` and `threshold` from here.
    """

    ladder: list[str] = Field(default_factory=list)  # model names, cheapest first; empty: no cascade
    max_depth: int | None = Field(default=None, ge=1)  # rungs one request may use; default: all
    scorer: str = "first_mean_logprob"  # a confidence feature (cascade/confidence.py)
    threshold: float = -0.8  # escalate when the rung's confidence is below this
    first_k: int = Field(default=16, ge=1)  # the "first k tokens" of the first_* features
    top_logprobs: int = Field(default=5, ge=1, le=20)  # asked of judged rungs
    stream_tokens: int = Field(default=16, ge=1)  # a stream is judged after this many tokens …
    stream_budget_ms: float = Field(default=300.0, gt=0)  # … or this long after its first chunk
    hedge_margin: float | None = Field(default=None, ge=0)  # auto: classifier score this close to a threshold
    thrash: ThrashSettings = Field(default_factory=ThrashSettings)

    @model_validator(mode="after")
    def _ladder_shape(self) -> CascadeSettings:
        if len(self.ladder) == 1:
            raise ValueError("a cascade ladder needs at least two rungs")
        if len(set(self.ladder)) != len(self.ladder):
            raise ValueError(f"the cascade ladder names a model twice: {self.ladder}")
        if self.scorer not in CONFIDENCE_FEATURES:
            raise ValueError(
                f"cascade.scorer {self.scorer!r} is not a confidence feature; known: {', '.join(CONFIDENCE_FEATURES)}"
            )
        return self


class DriftSettings(StrictModel):
    """Drift of `auto`'s scores and the cascade's confidences against the loaded version's
    reference (see core/drift.py and docs/learning.md#drift)."""

    enabled: bool = True
    window: int = Field(default=500, ge=10)  # latest values per signal, per process (also the warm-up's length)
    min_samples: int = Field(default=100, ge=1)  # in the window before a PSI is reported
    psi_alert: float = Field(default=0.2, gt=0)  # exported as switchyard_drift_psi_alert; the alert rule reads it

    @model_validator(mode="after")
    def _sizes(self) -> DriftSettings:
        if self.min_samples > self.window:
            raise ValueError(f"drift.min_samples ({self.min_samples}) is over drift.window ({self.window})")
        return self


class ResilienceSettings(StrictModel):
    """Retries, timeouts, breakers and load shedding around every backend (see backends/resilience.py)."""

    max_attempts: int = Field(default=2, ge=1)  # per model in the fallback chain
    backoff_base_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=2.0, ge=0)
    max_retry_after_s: float = Field(default=5.0, ge=0)  # a longer Retry-After moves on instead of waiting
    first_token_timeout_s: float | None = Field(default=20.0, gt=0)  # per attempt, non-stream requests too
    first_token_budget_s: float | None = Field(default=45.0, gt=0)  # no new attempt after this without a token
    attempt_timeout_s: float | None = Field(default=None, gt=0)  # a whole answer; streams end in-band
    request_timeout_s: float | None = Field(default=600.0, gt=0)  # everything, fallbacks included
    breaker_fail_max: int = Field(default=5, ge=1)
    breaker_reset_s: float = Field(default=30.0, gt=0)
    max_cooldown_s: float = Field(default=60.0, ge=0)  # a 429's Retry-After rests the model at most this long
    default_cooldown_s: float = Field(default=1.0, ge=0)  # the rest after a 429 without Retry-After
    max_in_flight: int | None = Field(default=None, ge=1)  # per model; beyond it, 429 + Retry-After
    saturation_wait_s: float = Field(default=10.0, gt=0)  # how long a priority request waits out saturation
    saturation_max_waiting: int = Field(default=64, ge=0)  # priority requests waiting at once; beyond, 429


class JudgeSettings(StrictModel):
    model: str | None = None  # a configured chat model; null: the strongest by price


class ShadowSettings(StrictModel):
    """Shadow sampling (switchyard.learning): a share of `auto` and `cascade` requests answered again
    by another model on spare capacity, the pair graded, the labelled row kept for re-tuning."""

    rate: float = Field(default=0.0, ge=0, le=1)  # share of auto/cascade requests shadowed; 0: off
    teams: list[str] = Field(default_factory=list)  # empty: every team
    models: list[str] = Field(default_factory=list)  # answering models or routes (auto, cascade); empty: all
    target: Literal["other_tier", "next_rung", "strongest"] = "other_tier"
    budget_usd_per_day: float = Field(default=5.0, ge=0, allow_inf_nan=False)  # shadow + judge calls, per UTC day
    store_prompts: bool = False  # false: rows keep the embedding, features and a keyed hash, never the text
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    retention_days: float = Field(default=30.0, gt=0)  # rows older than this are deleted
    max_pending: int = Field(default=256, ge=1)  # shadow jobs queued in a process; beyond, dropped
    concurrency: int = Field(default=1, ge=1)  # shadow jobs run at once in a process
    # each call of a job waits until fewer interactive requests than this are in flight here (1: none)
    yield_at_in_flight: int = Field(default=1, ge=1)
    # team or route (auto, cascade) -> grader (learning/graders.py GRADER_KINDS); the team's wins
    graders: dict[str, Literal["auto", "multiple_choice", "number", "exact", "json_schema", "judge"]] = Field(
        default_factory=dict
    )
    hash_key: SecretStr | None = None  # HMAC key of prompt_key; null: a random key kept in the database

    @property
    def is_on(self) -> bool:
        return self.rate > 0


class ModelAlias(StrictModel):
    """What a `model_aliases` pattern resolves to: a model name (or `auto`, `cascade`) and, for
    `auto`, the quality mode its requests route by unless they name one (`x-switchyard-quality`)."""

    model: str = Field(min_length=1)
    quality: Literal["economy", "balanced", "max"] | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SWITCHYARD__",
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    server: ServerSettings = Field(default_factory=ServerSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    resilience: ResilienceSettings = Field(default_factory=ResilienceSettings)
    billing: BillingSettings = Field(default_factory=BillingSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    cascade: CascadeSettings = Field(default_factory=CascadeSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    shadow: ShadowSettings = Field(default_factory=ShadowSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    models: list[ModelSettings] = Field(default_factory=list)
    teams: dict[str, TeamSettings] = Field(default_factory=dict)  # empty: any key, every model
    # glob -> a model name, or {model, quality}: the names clients send (claude-*-haiku-*) as models
    # of this proxy; in order, the first match wins; a configured model's own name is never aliased
    model_aliases: dict[str, str | ModelAlias] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_across_sections(self) -> Settings:
        """What no section can check alone: the names that models, adapters, fallbacks, the cascade
        and the teams give each other, in this order (the first problem is the one reported)."""
        if (refusal := workers_refusal(self.server.workers, self.billing, "server.workers:")) is not None:
            raise ValueError(refusal)
        adapters = _check_model_names(self.models, self.teams)
        by_name = {model.name: model for model in self.models}
        _check_model_links(self.models, by_name)
        _check_ladder_models(self.cascade.ladder, by_name)
        priorities = ("interactive", "batch", *self.billing.priority_tiers)
        _check_teams(self.teams, by_name, adapters, priorities)
        _check_ladder_logprobs(self.cascade.ladder, by_name)
        _check_shadow(self.shadow, by_name)
        _check_cache_routes(self.cache, by_name)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file arrives as init kwargs; the environment overrides it.
        return (env_settings, init_settings)


def workers_refusal(num_workers: int, billing: BillingSettings, named: str = "--workers") -> str | None:
    """Why `num_workers` processes cannot run with this billing config (None: they can; with no
    `redis_url`, `serve` starts a private Valkey for them to share)."""
    if num_workers > 1 and billing.is_valkey_off():
        return (
            f"{named} {num_workers} needs Valkey: budgets, rate limits and keys must be shared by the workers "
            "(billing.redis_url is 'none': give a URL, or leave it out for a private Valkey)"
        )
    return None


def format_location(loc: tuple[int | str, ...]) -> str:
    """('models', 0, 'litellm', 'foo') -> 'models[0].foo' (the union's tag after a model index is dropped)"""
    out = ""
    for i, part in enumerate(loc):
        if part in BACKEND_KINDS + ("unknown",) and i > 0 and isinstance(loc[i - 1], int):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _backend_named_in(loc: tuple[int | str, ...]) -> str | None:
    for i, part in enumerate(loc[1:], 1):
        if part in BACKEND_KINDS and isinstance(loc[i - 1], int):
            return str(part)
    return None


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for error in exc.errors():
        where = format_location(error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            backend = _backend_named_in(error["loc"])
            lines.append(f"  unknown key '{where}'" + (f" (backend '{backend}' does not take it)" if backend else ""))
        elif error["type"] == "literal_error" and error["loc"][-1] == "backend":
            lines.append(f"  {where}: must be one of {', '.join(BACKEND_KINDS)}, not {error['input']!r}")
        else:
            lines.append(f"  {where}: {error['msg']}")
    return "\n".join(lines)


def parse_settings(data: dict[str, Any], source: str) -> Settings:
    """Validate raw settings (a parsed file) and apply environment overrides."""
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from exc


def read_settings_file(path: str | Path) -> Settings:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return parse_settings(data, str(path))


Adapters = dict[str, tuple[ModelSettings, Any]]  # an adapter's name -> its base model and its settings


def _check_model_names(models: list[ModelSettings], teams: dict[str, TeamSettings]) -> Adapters:
    """Model and adapter names: none reserved, none twice (they share one namespace); an adapter's
    teams configured. Returns the adapters by name."""
    seen: set[str] = set()
    for name in (m.name for m in models):
        if name in RESERVED_MODEL_NAMES:
            raise ValueError(f"model name '{name}' is reserved: it asks Switchyard to choose")
        if name in seen:
            raise ValueError(f"model name '{name}' is listed twice")
        seen.add(name)
    adapters = {a.name: (m, a) for m in models for a in getattr(m, "adapters", ())}
    for model in models:
        for adapter in getattr(model, "adapters", ()):
            if adapter.name in RESERVED_MODEL_NAMES or adapter.name in seen:
                raise ValueError(f"model '{model.name}': adapter name '{adapter.name}' is taken (names are shared)")
            seen.add(adapter.name)
            for team_name in adapter.teams or ():
                if team_name not in teams:
                    raise ValueError(f"adapter '{adapter.name}' names team '{team_name}', which is not configured")
    return adapters


def _check_model_links(models: list[ModelSettings], by_name: dict[str, ModelSettings]) -> None:
    """Fallbacks and `degrade_to` name other models of the same kind; an embedding model has no tier."""
    for model in models:
        if model.degrade_to is not None and (model.degrade_to not in by_name or model.degrade_to == model.name):
            raise ValueError(f"model '{model.name}' degrades to '{model.degrade_to}', which is not another model")
        for fallback in model.fallbacks:
            if fallback not in by_name or fallback == model.name:
                raise ValueError(f"model '{model.name}' falls back to '{fallback}', which is not another model")
        for other in (*model.fallbacks, *([model.degrade_to] if model.degrade_to else [])):
            if by_name[other].kind != model.kind:
                raise ValueError(
                    f"model '{model.name}' ({model.kind}) falls back or degrades to '{other}' "
                    f"({by_name[other].kind}): both must be of one kind"
                )
        if model.kind == "embedding" and model.tier is not None:
            raise ValueError(f"model '{model.name}' embeds: it has no tier ('auto' routes chat models)")


def _check_ladder_models(ladder: list[str], by_name: dict[str, ModelSettings]) -> None:
    """The cascade's rungs are configured chat models."""
    for name in ladder:
        if name not in by_name:
            raise ValueError(f"cascade.ladder names '{name}', which is not a configured model")
        if by_name[name].kind != "chat":
            raise ValueError(f"cascade.ladder names '{name}', an embedding model")


def _check_ladder_logprobs(ladder: list[str], by_name: dict[str, ModelSettings]) -> None:
    """Every rung but the last is judged on its token logprobs, so it must return them."""
    for name in ladder[:-1]:
        if not by_name[name].has_logprobs:
            raise ValueError(
                f"cascade.ladder: '{name}' returns no token logprobs, so it cannot be judged; "
                "such a model can only be the last rung (or set its 'logprobs: true')"
            )


def _check_teams(
    teams: dict[str, TeamSettings],
    by_name: dict[str, ModelSettings],
    adapters: Adapters,
    priorities: tuple[str, ...],
) -> None:
    """Each team's priority is a tier, its models and default adapters are configured, and no API
    key names two teams."""
    team_of_key: dict[str, str] = {}
    for team_name, team in teams.items():
        if team.priority not in priorities:
            raise ValueError(
                f"team '{team_name}' has priority '{team.priority}', which is not one of {', '.join(priorities)} "
                "(name more in billing.priority_tiers)"
            )
        for model_name in team.models or ():
            if model_name not in by_name and model_name not in adapters:
                raise ValueError(f"team '{team_name}' may use '{model_name}', which is not a configured model")
        _check_default_adapters(team_name, team, adapters)
        for key in (k.get_secret_value() for k in team.api_keys):
            if key in team_of_key:
                raise ValueError(
                    f"team '{team_name}': an API key is listed twice (also under '{team_of_key[key]}'); "
                    "each key names one team"
                )
            team_of_key[key] = team_name


def _check_default_adapters(team_name: str, team: TeamSettings, adapters: Adapters) -> None:
    """A team's default adapters are configured, open to it, and at most one per base model."""
    parents: set[str] = set()
    for adapter_name in team.default_adapters:
        if adapter_name not in adapters:
            raise ValueError(f"team '{team_name}' has default adapter '{adapter_name}', which is not configured")
        base, adapter = adapters[adapter_name]
        if adapter.teams is not None and team_name not in adapter.teams:
            raise ValueError(f"team '{team_name}' has default adapter '{adapter_name}', which it may not use")
        if base.name in parents:
            raise ValueError(f"team '{team_name}' has two default adapters on model '{base.name}'")
        parents.add(base.name)


def _check_shadow(shadow: ShadowSettings, by_name: dict[str, ModelSettings]) -> None:
    """The judge is a configured chat model (teams may live in the database: not checked here)."""
    judge = shadow.judge.model
    if judge is not None and (judge not in by_name or by_name[judge].kind != "chat"):
        raise ValueError(f"shadow.judge.model names '{judge}', which is not a configured chat model")


def _check_cache_routes(cache: CacheSettings, by_name: dict[str, ModelSettings]) -> None:
    """cache.routes names chat models, `auto` or `cascade`."""
    for route in cache.routes:
        if route in RESERVED_MODEL_NAMES:
            continue
        if route not in by_name or by_name[route].kind != "chat":
            raise ValueError(f"cache.routes names '{route}', which is not a configured chat model, auto or cascade")
