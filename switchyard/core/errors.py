"""Every error Switchyard reports, and how it reaches the client: one tree, all of it here.

    SwitchyardError                     500 server_error
    ├── InvalidRequest                  400 invalid_request_error
    │   ├── MalformedJSON               400 invalid_json          (body is not JSON)
    │   ├── InvalidType                 400 invalid_type          (a string for a number, …)
    │   ├── JSONTooDeep                 400 json_too_deep         (over server.max_json_depth)
    │   ├── ArrayTooLong                400 array_above_max_length (messages, prompt token ids)
    │   ├── PromptTooLong               400 string_above_max_length (over server.max_prompt_chars)
    │   ├── ContextLengthExceeded       400 context_length_exceeded
    │   ├── UnsupportedParameter        400 unsupported_parameter (the model lacks a capability asked for)
    │   ├── WrongModelKind              400 unsupported_model     (a chat model asked for embeddings, …)
    │   └── ReloadRefused               400 reload_refused        (a routing file that cannot be used; the old stays)
    ├── AuthenticationFailed            401 invalid_api_key       (teams configured, key unknown)
    ├── ModelNotAllowed                 403 model_not_allowed     (not among the team's models)
    ├── Forbidden                       403 permission_denied     (another team's usage)
    ├── ModelNotFound                   404 model_not_found
    ├── NotFound                        404 not_found             (an admin API's team or key)
    ├── Conflict                        409 conflict              (a team that exists already)
    ├── RequestTimeout                  408 request_timeout       (no request head in server.header_timeout_s)
    ├── RequestTooLarge                 413 request_too_large
    ├── HeadersTooLarge                 431 request_header_fields_too_large
    ├── TooManyConnections              503 too_many_connections  (at server.max_connections, none idle)
    ├── NotConfigured                   503 not_configured        (a feature the config leaves off)
    ├── ServiceUnavailable              503 service_unavailable   (the batch queue's Valkey, …)
    ├── LimitsUnavailable               503 limits_unavailable    (Valkey unreachable, billing.fail_open off)
    ├── DatabaseUnavailable             503 database_unavailable  (usage, teams and keys' database)
    ├── ShuttingDown                    503 server_shutting_down  (ends a live stream at shutdown)
    ├── RateLimited                     429 rate_limit_exceeded   (carries retry_after_s)
    │   ├── RateLimitExceeded           429 rate_limit_exceeded   (a key's or team's RPM/TPM; x-ratelimit-*)
    │   └── BudgetExceeded              429 insufficient_quota    (a team's or key's budget is spent)
    └── BackendError                    502 upstream_error        (an upstream failed us)
        ├── BackendRejected             the upstream's own 4xx, status kept
        ├── BackendRateLimited          429 upstream_rate_limited (carries retry_after_s)
        │   ├── Shed                    429 load_shed             (not called: in-flight cap reached)
        │   └── CoolingDown             429 rate_limit_exceeded   (not called: a 429's Retry-After not over)
        ├── BackendUnavailable          503 upstream_unavailable  (refused, 5xx "overloaded")
        │   └── CircuitOpen             503 circuit_open          (not called: its breaker is open)
        ├── BackendTimeout              504 upstream_timeout
        │   ├── DeadlinePassed          504                       (our deadline cut the call)
        │   └── FirstTokenTimeout       504                       (no first token in time)
        └── AllAttemptsFailed           429, 502, 503 or 504 by what failed (every model of the chain)

Errors that never reach a client as such are their modules' own: a configuration that cannot be
used (`core.settings.ConfigError`, `core.thresholds.ThresholdsError`,
`classifier.model.ArtifactError`, `backends.embedded.models.ModelSourceError`,
`backends.embedded.draft_model.DraftModelError`), a file that cannot be read
(`core.traces.TraceFormatError`, `evals.collect.CollectError`, `evals.evaluate.EvalError`), the
database's (`billing.store.errors.StoreError` and its `StoreUnavailable`, `StoreConflict`,
`StoreNotFound`, which the HTTP layer answers as `DatabaseUnavailable`, `Conflict`, `NotFound`),
and a few signals caught where they are raised (`billing.directory.UnknownKey`,
`classifier.runtime.ScoreUnavailable`, `backends.sse.SSEDecodeError`, `batch.files.FileTooLarge`).

Each class carries its status, OpenAI error `type` and `code`. `error_body()` renders OpenAI's
shape ``{"error": {"message", "type", "param", "code"}}``. No web framework here: the HTTP layer's
`switchyard.proxy.error_handlers` is the one place that turns exceptions into responses, and it
never sends a stack trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack

import orjson


class _ErrorOptions(TypedDict, total=False):
    """`SwitchyardError`'s keyword arguments, for subclasses that pass them on."""

    param: str | None
    code: str | None
    retry_after_s: float | None


class _BackendErrorOptions(_ErrorOptions, total=False):
    backend: str | None
    detail: str | None


class SwitchyardError(Exception):
    status_code = 500
    error_type = "server_error"
    code: str | None = "internal_error"
    requested_model: str | None = None  # a refused body's `model`, when it was read that far (the request count)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after_s = retry_after_s

    @property
    def log_message(self) -> str:
        """What the log says: the message, with what only operators should read (`BackendError.detail`)."""
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {
            "message": self.message,
            "type": self.error_type,
            "param": self.param,
            "code": self.code,
        }

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"retry-after": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(SwitchyardError):
    status_code = 400
    error_type = "invalid_request_error"
    code: str | None = None


class MalformedJSON(InvalidRequest):
    code = "invalid_json"


class InvalidType(InvalidRequest):
    code = "invalid_type"


class JSONTooDeep(InvalidRequest):
    code = "json_too_deep"


class ArrayTooLong(InvalidRequest):
    code = "array_above_max_length"


class PromptTooLong(InvalidRequest):
    code = "string_above_max_length"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedParameter(InvalidRequest):
    """The model cannot do what a parameter asks (tools, JSON schema, images...): a 400 naming it."""

    code = "unsupported_parameter"


class WrongModelKind(InvalidRequest):
    """A chat model asked for embeddings, or an embedding model for a completion."""

    code = "unsupported_model"


class ReloadRefused(InvalidRequest):
    """`POST /admin/reload` found a thresholds file or classifier artifact it cannot use: the
    version routing before it goes on routing; the message says which file and why."""

    code = "reload_refused"


_ENDPOINTS = {"chat": "/v1/chat/completions, /v1/completions and /v1/responses", "embedding": "/v1/embeddings"}


def wrong_kind(model: str, kind: str) -> WrongModelKind:
    """The 400 for a request to `model` (of `kind`) that only a model of the other kind answers."""
    if kind == "chat":
        message = f"The model '{model}' is a chat model: it does not create embeddings; ask an embedding model."
    else:
        message = f"The model '{model}' is an embedding model: ask /v1/embeddings, or a chat model here."
    return WrongModelKind(f"{message} It serves {_ENDPOINTS[kind]}.", param="model")


class AuthenticationFailed(SwitchyardError):
    status_code = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotAllowed(SwitchyardError):
    status_code = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class Forbidden(SwitchyardError):
    status_code = 403
    error_type = "permission_error"
    code = "permission_denied"


class NotFound(SwitchyardError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Conflict(SwitchyardError):
    status_code = 409
    error_type = "invalid_request_error"
    code = "conflict"


class ModelNotFound(SwitchyardError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class RequestTimeout(SwitchyardError):
    status_code = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class RequestTooLarge(SwitchyardError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLarge(SwitchyardError):
    status_code = 431
    error_type = "invalid_request_error"
    code = "request_header_fields_too_large"


class TooManyConnections(SwitchyardError):
    status_code = 503
    error_type = "server_error"
    code = "too_many_connections"


class NotConfigured(SwitchyardError):
    """A feature the configuration leaves off (its message names the key that turns it on)."""

    status_code = 503
    error_type = "server_error"
    code = "not_configured"


class ServiceUnavailable(SwitchyardError):
    """A store the request needs did not answer (the batch queue's Valkey, say)."""

    status_code = 503
    error_type = "server_error"
    code = "service_unavailable"


class LimitsUnavailable(SwitchyardError):
    """Valkey (or Redis) unreachable while `billing.fail_open` is off: no request passes unchecked."""

    status_code = 503
    error_type = "server_error"
    code = "limits_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=1.0)


class DatabaseUnavailable(SwitchyardError):
    """The database behind usage, teams and keys is down or slow."""

    status_code = 503
    error_type = "server_error"
    code = "database_unavailable"


class ShuttingDown(SwitchyardError):
    """The server is shutting down: a live stream ends with this error, then its end."""

    status_code = 503
    error_type = "server_error"
    code = "server_shutting_down"


class RateLimited(SwitchyardError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class RateHeaders(Protocol):
    """The state of the rate buckets a refusal read (`switchyard.billing.limits.RateStatus`)."""

    def headers(self) -> dict[str, str]: ...


class RateLimitExceeded(RateLimited):
    """A key's or team's RPM or TPM is used up: `retry-after` and the `x-ratelimit-*` headers."""

    def __init__(
        self, message: str, *, status: RateHeaders, retry_after_s: float | None, limit: str = "requests"
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.status = status
        self.limit = limit  # the bucket's kind that refused it: requests or tokens

    def headers(self) -> dict[str, str]:
        headers = self.status.headers()
        if self.retry_after_s is not None:  # rounded up: a client retrying on time finds the room there
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers


class BudgetExceeded(RateLimited):
    """A budget that renews later than `RETRY_SOON_S` from now, or a request no budget could ever
    hold (no `retry_after_s`), also says `x-should-retry: false`: the OpenAI SDKs then give up at
    once rather than retrying a refusal that will not pass."""

    error_type = "insufficient_quota"
    code = "insufficient_quota"
    RETRY_SOON_S = 60.0

    def headers(self) -> dict[str, str]:
        headers = super().headers()
        if self.retry_after_s is None or self.retry_after_s > self.RETRY_SOON_S:
            headers["x-should-retry"] = "false"
        return headers


class BackendError(SwitchyardError):
    """An upstream failed; `backend` names the deployment that did.

    `message` reaches the client and the ledger, so it names the deployment (`openai#0`), never
    its address; `detail`, for the log only, may add the host and the transport's own words.
    """

    status_code = 502
    error_type = "upstream_error"
    code: str | None = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        backend: str | None = None,
        detail: str | None = None,
        **kwargs: Unpack[_ErrorOptions],
    ) -> None:
        super().__init__(message, **kwargs)
        self.backend = backend
        self.detail = detail

    @property
    def log_message(self) -> str:
        return self.detail or self.message


class BackendRejected(BackendError):
    """The upstream refused the request as invalid (its 4xx); the client hears the same status."""

    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, status_code: int, **kwargs: Unpack[_BackendErrorOptions]) -> None:
        super().__init__(message, **kwargs)
        self.status_code = status_code


class BackendRateLimited(BackendError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "upstream_rate_limited"


class BackendUnavailable(BackendError):
    status_code = 503
    code = "upstream_unavailable"


class BackendTimeout(BackendError):
    status_code = 504
    code = "upstream_timeout"


class Shed(BackendRateLimited):
    """Not called: the deployment's in-flight cap is reached (its load shed)."""

    code = "load_shed"


class CircuitOpen(BackendUnavailable):
    """Not called: the deployment's breaker is open after its recent failures."""

    code = "circuit_open"


class CoolingDown(BackendRateLimited):
    """Not called: the upstream answered 429 a moment ago and its `Retry-After` has not passed."""

    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, remaining_s: float, backend: str | None = None) -> None:
        super().__init__(message, retry_after_s=max(1, math.ceil(remaining_s)), backend=backend)


class DeadlinePassed(BackendTimeout):
    """Our own deadline (the request's, or the attempt's) cut a call: the client's or the
    configuration's limit, not the upstream's fault. Metered as a failed attempt; neutral for the
    breakers (an upstream that stalls is caught by the first-token and stream idle timeouts)."""


class FirstTokenTimeout(BackendTimeout):
    """No first token in time: the model is not asked again within this request."""


@dataclass(slots=True)
class Attempt:
    """One failed attempt at a model, kept by `AllAttemptsFailed`."""

    model: str
    error: SwitchyardError

    def describe(self, *, for_log: bool = False) -> str:
        text = self.error.log_message if for_log else self.error.message
        return f"{self.model}: {self.error.status_code} {text}"


class AllAttemptsFailed(BackendError):
    """Every model in the chain failed; `attempts` keeps each failure in order."""

    def __init__(self, attempts: list[Attempt]) -> None:
        kinds = {type(a.error) for a in attempts if not isinstance(a.error, BudgetExceeded)}
        limited = [a for a in attempts if isinstance(a.error, BackendRateLimited)]
        if limited and all(issubclass(k, BackendRateLimited | CircuitOpen) for k in kinds):
            # nothing answered only for rate limits (an open circuit aside): back when a cooldown ends
            status, code = 429, "rate_limit_exceeded"
        elif kinds and all(issubclass(k, BackendTimeout) for k in kinds):
            status, code = 504, "upstream_timeout"
        elif kinds and all(issubclass(k, BackendUnavailable | BackendTimeout) for k in kinds):
            status, code = 503, "upstream_unavailable"
        else:
            status, code = 502, "upstream_error"
        waits = limited if status == 429 else attempts
        retry_after = [a.error.retry_after_s for a in waits if a.error.retry_after_s is not None]
        heading = f"All {len(attempts)} attempts failed: "
        message = heading + "; ".join(a.describe() for a in attempts)
        detail = heading + "; ".join(a.describe(for_log=True) for a in attempts)
        super().__init__(message, code=code, retry_after_s=min(retry_after) if retry_after else None, detail=detail)
        self.status_code = status
        self.error_type = "rate_limit_error" if status == 429 else "upstream_error"
        self.attempts = attempts


def error_body(exc: SwitchyardError) -> bytes:
    return orjson.dumps({"error": exc.to_dict()})
