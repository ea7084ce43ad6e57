"""The connection edge: what a client's connection may do before a request reaches the app.

uvicorn (with httptools) has a keep-alive timeout but no limit on the size of a request head, no
deadline to send it, and no cap on open connections, so a slow or hostile client can hold
connections and memory forever. `EdgeProtocol` is uvicorn's own `HttpToolsProtocol` with those
limits added (see docs/edge.md for why uvicorn and not another server):

- a request head (request line + headers) over `server.max_header_bytes` is a 431, found by
  counting bytes before the parser sees them, so a 100 MB header is never read;
- a head not complete within `server.header_timeout_s` (from connect, or from the end of the
  previous response) is a 408;
- at `server.max_connections`, a newcomer closes the connection idle the longest (one waiting for a
  request head, or idle between requests; idle for over a second), else the one whose body trickles in slowest (under
  1 KiB/s for over 2 s); when there is neither, the newcomer gets a 503;
- the server's own 400s (a malformed request line, a bad Content-Length) are OpenAI-shaped.

`uvicorn_config()` is the one place that builds the uvicorn Config, for `switchyard serve` and the
test servers alike; its access log, when on, has credentials in query strings masked
(`switchyard.proxy.access_log`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from switchyard.core.errors import (
    HeadersTooLarge,
    InvalidRequest,
    RequestTimeout,
    SwitchyardError,
    TooManyConnections,
    error_body,
)
from switchyard.core.settings import ServerSettings
from switchyard.proxy.access_log import install_access_log_redaction

logger = logging.getLogger("switchyard.edge")

LINGER_S = 1.0  # after an error response, how long the client has to read it before the close
LINGER_DISCARD_BYTES = 1024 * 1024  # read and dropped meanwhile (to see the client's own close), then no more
REFUSAL_LINGER_S = 0.2  # the same for a newcomer refused at the cap: short, a flood of them must not hold fds
REFUSAL_DISCARD_BYTES = 64 * 1024
MAX_LINGERING_REFUSALS = 32  # beyond this many at once, a refusal closes at once (a fraction of the fd reserve)
# At the cap with nothing idle, a body slower than this for longer than the grace is closed to make
# room: a client trickling its body (1 byte/s until body_timeout_s) would otherwise hold the slot.
IDLE_GRACE_S = 1.0  # a connection idle for less is not closed to make room (see _Connections.make_room)
SLOW_BODY_BYTES_S = 1024.0
SLOW_BODY_GRACE_S = 2.0
NOFILE_RESERVE_MIN = 128  # file descriptors kept for upstream sockets, the ledger, model files
MAX_ACCEPT_BACKLOG = 2048  # uvicorn's default listen backlog, kept where the open-file limit allows
COALESCE_MAX_BYTES = 64 * 1024  # written at once, without waiting for the loop's turn, past this


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int
    header_timeout_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, server: ServerSettings) -> EdgeLimits:
        max_connections = effective_max_connections(server.max_connections)
        if max_connections < server.max_connections:
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            logger.info(
                "server.max_connections is %d: the open-file limit (%d) leaves room for no more",
                max_connections,
                nofile,
            )
        return cls(server.max_header_bytes, server.header_timeout_s, max_connections)


def _nofile_reserve(nofile: int) -> int:
    return max(NOFILE_RESERVE_MIN, nofile // 4)


def effective_max_connections(configured: int, nofile: int | None = None) -> int:
    """The configured cap, lowered so that client sockets leave file descriptors for the rest."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, nofile - _nofile_reserve(nofile)))


def accept_backlog(nofile: int | None = None) -> int:
    """The listen backlog: a quarter of the fd reserve, at most uvicorn's 2,048.

    The event loop accepts everything queued in one go (asyncio up to the backlog, libuv until the
    queue is empty) before the edge counts a single connection against the cap, so a deep queue
    of newcomers at the cap could take every file descriptor: asyncio then stops accepting for a
    second, libuv drops connections. The backlog bounds that batch inside the reserve."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return MAX_ACCEPT_BACKLOG
    return max(16, min(MAX_ACCEPT_BACKLOG, _nofile_reserve(nofile) // 4))


def raise_nofile_limit() -> None:
    """Raise the soft open-file limit to the hard one, as Go and nginx do: the default soft 1,024
    is far below what a gateway needs, and only the hard limit is an operator's decision."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # some platforms cap it lower than the reported hard limit
            logger.info("could not raise the open-file limit from %d to %d", soft, hard)


class _Connections:
    """Every open connection of one server, and those idle, the longest idle first."""

    def __init__(self) -> None:
        self.num_open = 0
        self.num_lingering_refusals = 0
        self.idle: OrderedDict[EdgeProtocol, float] = OrderedDict()  # -> idle since (loop time)
        self.in_body: set[EdgeProtocol] = set()  # request bodies being read

    def make_room(self, newcomer: EdgeProtocol) -> bool:
        """Close one connection for `newcomer`: the longest idle, else the slowest body. A connection
        idle for less than IDLE_GRACE_S is spared: it is most likely a newcomer about to send its
        request, and a burst of newcomers at the cap would otherwise close one another."""
        now = newcomer.loop.time()
        for victim, since in self.idle.items():
            if now - since < IDLE_GRACE_S:
                break  # the rest are younger still
            if victim is not newcomer:
                victim.close_idle()
                return True
        slowest = self._slowest_body(now)
        if slowest is None:
            return False
        logger.debug("at the connection cap: closing a request whose body trickles in (%s)", slowest.body_rate_text())
        slowest.close_idle()
        return True

    def _slowest_body(self, now: float) -> EdgeProtocol | None:
        """A body under SLOW_BODY_BYTES_S for over SLOW_BODY_GRACE_S (the slowest): a client that
        trickles its body holds a slot another request could use; a real upload is far faster."""
        slowest, slowest_rate = None, SLOW_BODY_BYTES_S
        for conn in self.in_body:
            elapsed = now - conn.body_started_at
            if elapsed >= SLOW_BODY_GRACE_S and (rate := conn.body_bytes / elapsed) < slowest_rate:
                slowest, slowest_rate = conn, rate
        return slowest


class _CoalescingTransport:
    """A connection's transport whose writes of one turn of the event loop go out as one.

    uvicorn writes a response's head and each body message separately, a system call each: a
    relayed stream whose upstream events arrive together was 52 writes, the largest single cost of
    streaming. The bytes and their order are the same; they leave at the end of the loop's turn
    (or at once past COALESCE_MAX_BYTES), and a close or EOF sends what waits first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []
        self._num_bytes = 0
        self._is_scheduled = False

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._num_bytes += len(data)
        if self._num_bytes >= COALESCE_MAX_BYTES:
            self.flush()
        elif not self._is_scheduled:
            self._is_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._is_scheduled = False
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._num_bytes = 0
        if not self._transport.is_closing():  # the client left meanwhile: nothing to send it
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class EdgeProtocol(HttpToolsProtocol):
    limits: ClassVar[EdgeLimits]
    registry: ClassVar[_Connections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the parser is reading a request head
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._counted = False
        self._lingering_refusal = False
        self._ended = False  # an edge error was sent or the connection closed: ignore what comes
        self._discard_budget = LINGER_DISCARD_BYTES
        self.body_started_at = 0.0  # when the current request's headers were complete
        self.body_bytes = 0  # of its body, so far

    # connection lifecycle

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self.registry.num_open += 1
        self._counted = True
        if self.registry.num_open > self.limits.max_connections and not self.registry.make_room(self):
            self._refuse()
            return
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        if self._counted:
            self._counted = False
            self.registry.num_open -= 1
        if self._lingering_refusal:
            self._lingering_refusal = False
            self.registry.num_lingering_refusals -= 1
        super().connection_lost(exc)

    def _refuse(self) -> None:
        """A 503 for a newcomer at the cap. A client that sent its request right after connecting
        would read a reset instead of the 503 if the connection closed on its unread request, so
        the refusal lingers a moment to read and drop it; only a few at once, so that a flood of
        newcomers costs no more file descriptors than the cap allows for."""
        refusal = TooManyConnections("The server is at its connection limit; try again shortly.")
        if self.registry.num_lingering_refusals >= MAX_LINGERING_REFUSALS:
            self._end_with(refusal, linger_s=0)
            return
        self.registry.num_lingering_refusals += 1
        self._lingering_refusal = True
        self._discard_budget = REFUSAL_DISCARD_BYTES
        self._end_with(refusal, linger_s=REFUSAL_LINGER_S)

    def close_idle(self) -> None:
        """Close this idle connection (to make room for a newcomer, or after keep-alive)."""
        self._stop_waiting()
        self._ended = True
        self.transport.close()

    def _stop_waiting(self) -> None:
        self._cancel_head_timer()
        self.registry.idle.pop(self, None)
        self.registry.in_body.discard(self)

    def body_rate_text(self) -> str:
        elapsed = self.loop.time() - self.body_started_at
        return f"{self.body_bytes} bytes in {elapsed:.1f} s"

    # the request head: its size and its deadline

    def _await_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._wait_idle()

    def _wait_idle(self) -> None:
        """No request in progress: the connection may be evicted at the cap, and must go on (with a
        request head, or the rest of a body the app did not read) within the header deadline."""
        self.registry.idle[self] = self.loop.time()
        self.registry.idle.move_to_end(self)
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._on_head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _on_head_timeout(self) -> None:
        self._head_timer = None
        if not self._in_head or (self._head_bytes == 0 and self.cycle is not None):
            self.close_idle()  # idle between requests, or in the rest of a body answered: nothing to answer
            return
        self._end_with(
            RequestTimeout(
                f"The request line and headers did not arrive within {self.limits.header_timeout_s:g} s "
                "(server.header_timeout_s)."
            )
        )

    def data_received(self, data: bytes) -> None:
        if self._ended:
            self._discard_budget -= len(data)
            if self._discard_budget < 0:
                self.flow.pause_reading()
            return
        if not self._in_head:
            super().data_received(data)
            return
        room = self.limits.max_header_bytes - self._head_bytes
        head_part = data[:room] if len(data) > room else data
        self._head_bytes += len(head_part)
        super().data_received(head_part)
        if self._ended or self.transport.is_closing():
            return
        if self._in_head and self._head_bytes >= self.limits.max_header_bytes:
            limit = self.limits.max_header_bytes
            message = f"The request line and headers exceed {limit} bytes (server.max_header_bytes)."
            self._end_with(HeadersTooLarge(message))
        elif len(head_part) < len(data):
            self.data_received(data[len(head_part) :])

    # parser callbacks, around uvicorn's

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        self._unset_keepalive_if_required()  # armed in on_message_complete, before this head in the same read
        self.registry.idle.pop(self, None)
        self.body_started_at, self.body_bytes = self.loop.time(), 0
        self.registry.in_body.add(self)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.registry.in_body.discard(self)
        super().on_message_complete()
        self._in_head = True  # what comes next is the next request's head
        self._head_bytes = 0
        if self.cycle.response_complete and not self.transport.is_closing() and not self.pipeline:
            # the rest of a body answered early has come: the connection waits for its next request
            self._await_head()
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() or self.pipeline:
            return
        if self._in_head:
            self._await_head()
        else:
            # answered before its body was read (a 404, a 401, a 413): the parser reads the rest and
            # drops it; counted as the next head, it would be answered with a 431 or a 408 that the
            # client's next request then reads. The next head is awaited once the body has ended.
            self._wait_idle()

    def _unsupported_upgrade_warning(self) -> None:
        # uvicorn's two warnings would tell the operator to install a WebSocket library: the
        # server has none on purpose (uvicorn_config), and the request is served as plain HTTP
        self.logger.debug("An Upgrade header was ignored: the request is served as plain HTTP.")

    # answers of the edge itself

    def send_400_response(self, msg: str) -> None:
        message = "The request is not valid HTTP/1.1 (its request line, a header or the Content-Length)."
        self._end_with(InvalidRequest(message, code="invalid_http_request"))

    def _end_with(self, exc: SwitchyardError, *, linger_s: float = LINGER_S) -> None:
        """Answer with `exc` (unless a response is under way), then close, leaving the client time
        to read the answer instead of resetting the connection under it (unread data makes the
        close a reset)."""
        self._stop_waiting()
        self._ended = True
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        body = error_body(exc)
        head = [STATUS_LINE[exc.status_code]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        if not linger_s:
            self.transport.close()
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(linger_s, self.transport.close)


def edge_protocol(limits: EdgeLimits) -> type[EdgeProtocol]:
    """A protocol class for one server: its limits and its own count of connections."""
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits, "registry": _Connections()})


def uvicorn_config(app: Any, server: ServerSettings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn Config for `app` with the edge's limits from `server` (`overrides` win)."""
    options: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "log_level": server.log_level,
        "access_log": server.access_log,
        "loop": "uvloop" if os.name == "posix" else "auto",
        "http": edge_protocol(EdgeLimits.from_settings(server)),
        "timeout_keep_alive": server.keepalive_timeout_s,
        "backlog": accept_backlog(),
        # no WebSocket routes; an upgrade would hand the connection to uvicorn's WebSocket
        # protocol, out of the edge's count for good (an Upgrade header is ignored instead)
        "ws": "none",
        "timeout_graceful_shutdown": 5,
    }
    config = uvicorn.Config(app, **(options | overrides))
    install_access_log_redaction()  # after the Config, which sets up uvicorn's loggers
    return config
