"""A backend that speaks OpenAI's HTTP API: vLLM, the embedded engine's server, OpenAI itself.

All HTTP backends share one pooled `aiohttp.ClientSession` (`switchyard.backends.registry.build_http_session`). It is
aiohttp rather than httpx because the request path is the product: measured in
`bench/RESULTS.md`, httpx's pool cost more CPU per request than everything else Switchyard does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp
import orjson

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.balancer import LeastOutstanding
from switchyard.backends.base import AnyRequest, Backend, BackendHealth, Pick, StreamProgress
from switchyard.backends.breaker import Breaker
from switchyard.backends.sse import SSEDecodeError, SSEEvents, iter_sse_data
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import (
    BackendError,
    BackendRateLimited,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    CircuitOpen,
    ContextLengthExceeded,
    CoolingDown,
    SwitchyardError,
)
from switchyard.core.messages_wire import ANTHROPIC_ONLY_FIELDS
from switchyard.core.tracing import traceparent_headers
from switchyard.core.urls import replica_label, split_credentials


@dataclass(eq=False, slots=True)
class Replica:
    """One server of a model. Credentials in `base_url` are taken out here and become its auth:
    `user:password@` is sent as HTTP Basic, `api_key` as a Bearer key (not both); `label` names it
    to clients (`openai#0`: its kind and its place in the model's replicas, set by the backend)."""

    KIND: ClassVar[str] = "openai"

    base_url: str
    api_key: str | None = field(default=None, repr=False)
    num_outstanding: int = 0
    is_ready: bool = True
    last_health: str = "not probed yet"
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    label: str = ""
    breaker: Breaker | None = field(default=None, repr=False)  # when the model has several replicas

    def __post_init__(self) -> None:
        self.base_url, user, password = split_credentials(self.base_url.rstrip("/"))
        self.label = replica_label(self.KIND, 0)
        self.headers = {"content-type": "application/json"}
        if user is not None and self.api_key:
            raise ValueError("a replica's base_url carries credentials and an api_key is given too; give one")
        if user is not None:
            self.headers["authorization"] = "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        elif self.api_key:
            self.headers["authorization"] = f"Bearer {self.api_key}"


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """What an upstream's error body says, in OpenAI's shape where it has one."""

    message: str
    code: str | None = None
    param: str | None = None

    @classmethod
    def parse(cls, body: bytes) -> UpstreamError:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            error = orjson.loads(body).get("error")
            if isinstance(error, dict) and error.get("message"):
                code, param = error.get("code"), error.get("param")
                # vLLM's `code` is the HTTP status, a number: not a code a client could match on
                return cls(
                    str(error["message"]),
                    code if isinstance(code, str) else None,
                    param if isinstance(param, str) else None,
                )
            if isinstance(error, str):
                return cls(error)
        return cls(body[:200].decode("utf-8", "replace").strip() or "no body")


class OpenAIHTTPBackend(Backend):
    """One public model served by one or more OpenAI-compatible replicas over a shared session."""

    def __init__(
        self,
        name: str,
        replicas: list[Replica],
        session: aiohttp.ClientSession,
        *,
        upstream_model: str | None = None,
        read_timeout_s: float | None = None,
        stream_idle_timeout_s: float | None = None,
        health_timeout_s: float = 2.0,
    ) -> None:
        if not replicas:
            raise ValueError("a backend needs at least one replica")
        self.name = name
        self.replicas = replicas
        for index, replica in enumerate(replicas):
            replica.label = replica_label(replica.KIND, index)
        self.upstream_model = upstream_model or name
        self._session = session
        self._balancer = LeastOutstanding()
        # The longest silence between two reads: the answer's (a plain request: all of it comes at
        # the end), or a started stream's, the smaller of the two (a stalled stream ends there).
        read_s = read_timeout_s if read_timeout_s is not None else session.timeout.sock_read
        idle_s = read_s if stream_idle_timeout_s is None or read_s is None else min(read_s, stream_idle_timeout_s)
        connect_s = session.timeout.sock_connect
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=idle_s)
        self._health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)

    def attach_breakers(self, make_breaker: Callable[[], Breaker]) -> list[tuple[str, Breaker]]:
        if len(self.replicas) < 2:
            return []  # the model's own breaker is this replica's
        for replica in self.replicas:
            replica.breaker = make_breaker()
        return [(replica.label, replica.breaker) for replica in self.replicas if replica.breaker is not None]

    def pick(self, request: AnyRequest, *, use_breakers: bool = False) -> Pick:
        """The replica for `request`; with `use_breakers`, among those whose breaker admits a call
        (when the executor keeps breakers for them), with the chosen one's ticket."""
        if not use_breakers or self.replicas[0].breaker is None:
            return Pick(self._choose(request, self.replicas).label)
        admitted = [r for r in self.replicas if r.breaker is not None and r.breaker.refusal() is None]
        if not admitted:
            raise self._none_admitted()
        replica = self._choose(request, admitted)
        return Pick(replica.label, replica.breaker.admit() if replica.breaker is not None else None)

    def _replica(self, request: AnyRequest, pick: Pick | None) -> Replica:
        label = (pick or self.pick(request)).label
        for replica in self.replicas:
            if replica.label == label:
                return replica
        raise LookupError(f"{self.name} has no replica {label!r}")

    def _none_admitted(self) -> BackendError:
        cooling = [r.breaker.cooldown_left_s() for r in self.replicas if r.breaker is not None]
        if any(cooling):
            remaining_s = min(s for s in cooling if s > 0)
            return CoolingDown(
                f"every replica of {self.name} is open or cooling down after a 429", remaining_s=remaining_s
            )
        return CircuitOpen(f"circuit open on every replica of {self.name}", backend=self.name, retry_after_s=1)

    def _choose(self, request: AnyRequest, candidates: list[Replica]) -> Replica:
        """Which of `candidates` takes `request`: the one with the fewest requests in flight."""
        return self._balancer.pick(candidates)

    # -- requests -------------------------------------------------------------------------------

    def _body(self, request: AnyRequest, *, stream: bool) -> bytes:
        body: dict[str, Any] = request.wire_payload()
        for name in ANTHROPIC_ONLY_FIELDS.intersection(body):
            del body[name]
        body["model"] = self.upstream_model
        if stream:
            body["stream"] = True
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        else:
            body.pop("stream", None)
            body.pop("stream_options", None)
        return orjson.dumps(body)

    @staticmethod
    def _path(request: AnyRequest) -> str:
        if isinstance(request, EmbeddingRequest):
            return "/embeddings"
        return "/chat/completions" if isinstance(request, ChatCompletionRequest) else "/completions"

    async def _post(self, replica: Replica, request: AnyRequest, *, stream: bool) -> aiohttp.ClientResponse:
        """POST and return once the status line and headers have arrived.

        A pooled connection that the upstream closed while idle fails with
        `ServerDisconnectedError` before any response: that request never reached the model, so
        it is sent once more on a fresh connection.
        """
        url, body = replica.base_url + self._path(request), self._body(request, stream=stream)
        timeout = self._stream_timeout if stream else self._timeout
        trace = traceparent_headers()
        headers = {**replica.headers, **trace} if trace else replica.headers
        try:
            return await self._session.post(url, data=body, headers=headers, timeout=timeout)
        except aiohttp.ServerDisconnectedError:
            return await self._session.post(url, data=body, headers=headers, timeout=timeout)

    def _fail(self, replica: Replica, exc: Exception) -> BackendError:
        """The one place where transport exceptions become ours.

        The client and the ledger hear the deployment's label and the exception's class; the
        transport's own words name the host and port, so they go to `detail` (the log) only.
        """
        where = f"upstream {self.name} ({replica.label})"
        detail = f"{where} at {replica.base_url}: {type(exc).__name__}: {exc}"
        if isinstance(exc, asyncio.TimeoutError):
            return BackendTimeout(f"{where} timed out ({type(exc).__name__})", backend=self.name, detail=detail)
        if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
            message = f"{where} is unreachable or dropped the connection ({type(exc).__name__})"
            return BackendUnavailable(message, backend=self.name, detail=detail)
        if isinstance(exc, SSEDecodeError):
            return BackendError(f"{where} sent a malformed stream: {exc}", backend=self.name, detail=detail)
        return BackendError(f"{where} failed ({type(exc).__name__})", backend=self.name, detail=detail)

    def _status_error(self, replica: Replica, status: int, headers: Mapping[str, str], body: bytes) -> SwitchyardError:
        error = UpstreamError.parse(body)
        reason = f"upstream {self.name} ({replica.label}) returned {status}: {error.message}"
        retry_after_s = _retry_after_s(headers)
        if status == 400 and b"context_length_exceeded" in body:
            # a model with a larger window may answer
            return ContextLengthExceeded(reason, param=error.param or "messages")
        if status == 429:
            return BackendRateLimited(reason, backend=self.name, retry_after_s=retry_after_s)
        if status in (400, 404, 413, 422):
            status_code = 400 if status == 422 else status
            return BackendRejected(
                reason, backend=self.name, status_code=status_code, code=error.code, param=error.param
            )
        if status in (502, 503):
            return BackendUnavailable(reason, backend=self.name, retry_after_s=retry_after_s)
        if status == 504:
            return BackendTimeout(reason, backend=self.name)
        return BackendError(reason, backend=self.name)

    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult:
        replica = self._replica(request, pick)
        replica.num_outstanding += 1
        try:
            response = await self._post(replica, request, stream=False)
            try:
                data = await response.read()
                status, headers = response.status, response.headers
            finally:
                response.release()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._fail(replica, exc) from exc
        finally:
            replica.num_outstanding -= 1
        if status != 200:
            raise self._status_error(replica, status, headers, data)
        result = CompletionResult(data)
        if not (
            result.looks_like_embeddings() if isinstance(request, EmbeddingRequest) else result.looks_like_completion()
        ):
            raise BackendError(f"upstream {self.name} sent a malformed response", backend=self.name)
        return result.named(self.name)

    async def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]:
        replica = self._replica(request, pick)
        replica.num_outstanding += 1
        response: aiohttp.ClientResponse | None = None
        is_complete = False
        try:
            try:
                response = await self._post(replica, request, stream=True)
                if response.status != 200:
                    raise self._status_error(replica, response.status, response.headers, await response.read())
                async for data in iter_sse_data(response.content.iter_any()):
                    if not (data.startswith(b"{") and data.endswith(b"}")):
                        raise SSEDecodeError(f"event data is not a JSON object: {data[:80]!r}")
                    yield StreamChunk(data).named(self.name)
                is_complete = True
            except (TimeoutError, aiohttp.ClientError, SSEDecodeError) as exc:
                raise self._fail(replica, exc) from exc
        finally:
            _end_stream(replica, response, is_complete)

    async def complete_from_stream(
        self, request: AnyRequest, pick: Pick | None, progress: StreamProgress
    ) -> CompletionResult:
        """The upstream's stream read in bulk: its events split once a read, the payloads parsed
        in one pass and assembled at the end; no chunk objects, no hop per event. Silence between
        reads is bounded as a stream's (the stream idle timeout)."""
        replica = self._replica(request, pick)
        replica.num_outstanding += 1
        response: aiohttp.ClientResponse | None = None
        is_complete = False
        payloads: list[bytes] = []
        try:
            try:
                response = await self._post(replica, request, stream=True)
                if response.status != 200:
                    raise self._status_error(replica, response.status, response.headers, await response.read())
                events = SSEEvents()
                async for data in response.content.iter_any():
                    new = events.feed(data)
                    if new:
                        if not payloads:
                            progress.first_event()
                        payloads += new
                        progress.num_events(len(payloads))
                    if events.is_done:
                        break
                payloads += events.end()
                if not events.is_done:
                    raise SSEDecodeError("the stream ended without [DONE]")
                is_complete = True
            except (TimeoutError, aiohttp.ClientError, SSEDecodeError) as exc:
                raise self._fail(replica, exc) from exc
        finally:
            _end_stream(replica, response, is_complete)
        assembler = AnswerAssembler(self.name, self.name)
        assembler.add_events(payloads)
        return assembler.result()

    # -- health ---------------------------------------------------------------------------------

    async def _probe(self, replica: Replica) -> None:
        try:
            async with self._session.get(
                replica.base_url + "/models", headers=replica.headers, timeout=self._health_timeout
            ) as response:
                status = response.status
                await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            replica.is_ready, replica.last_health = False, f"{type(exc).__name__}: {exc}"
            return
        replica.is_ready = status == 200
        replica.last_health = "ok" if replica.is_ready else f"GET /models returned {status}"

    async def health(self) -> BackendHealth:
        await asyncio.gather(*(self._probe(replica) for replica in self.replicas))
        num_ready = sum(replica.is_ready for replica in self.replicas)
        detail = "; ".join(f"{r.label} at {r.base_url}: {r.last_health}" for r in self.replicas)
        return BackendHealth(is_ready=num_ready > 0, detail=f"{num_ready}/{len(self.replicas)} ready; {detail}")

    def is_ready(self) -> bool:
        return any(replica.is_ready for replica in self.replicas)

    async def aclose(self) -> None:
        """The shared session belongs to the app; nothing of our own to close."""


def _end_stream(replica: Replica, response: aiohttp.ClientResponse | None, is_complete: bool) -> None:
    """A finished stream returns its connection to the pool; anything else (the client left, an
    error) closes it, which is how the upstream learns to stop generating."""
    replica.num_outstanding -= 1
    if response is not None:
        if is_complete:
            response.release()
        else:
            response.close()
