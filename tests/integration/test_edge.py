"""The connection edge, with raw sockets: oversized and slow request heads, idle connections, the
connection cap, the server's own 400s, and the log lines a flood of bad requests leaves behind."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy import edge
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

ERROR_KEYS = {"message", "type", "param", "code"}
GUARD_S = 20  # a socket's timeout: only there to turn a hang into a failure


@contextmanager
def _proxy(fake_upstream: str | None = None, log_level: str = "error", **server) -> Iterator[str]:
    models = [{"name": "fake-small", "base_url": fake_upstream}] if fake_upstream else []
    # a health probe of the fake upstream, late on a busy machine, must not make the proxy unready
    upstream = {"health_timeout_s": GUARD_S}
    settings = Settings(models=models, server=server, upstream=upstream, billing={"ledger_path": None})
    options = {"log_level": log_level} if log_level != "error" else {}
    with serve_in_thread(create_app(settings), **options) as url:
        yield url


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GUARD_S)


def _read_until_closed(sock: socket.socket) -> bytes:
    reply = b""
    while data := sock.recv(65536):
        reply += data
    return reply


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(65536)
    head, _, body = reply.partition(b"\r\n\r\n")
    [length] = [int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _error(reply: bytes, status: int) -> dict:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), reply[:200]
    assert b"content-type: application/json" in head.lower()
    payload = orjson.loads(body)
    assert set(payload) == {"error"} and set(payload["error"]) == ERROR_KEYS
    return payload["error"]


def _stream_huge_header(url: str, total_bytes: int) -> tuple[int, bytes]:
    """Send a header of `total_bytes`, stopping as soon as the server answers or closes."""
    sock = _connect(url)
    sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Huge: ")
    chunk, num_sent = b"a" * 65536, 0
    try:
        while num_sent < total_bytes:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                num_sent += sock.send(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        return num_sent, _read_until_closed(sock)
    finally:
        sock.close()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url).status_code
    except httpx.TransportError:  # refused at the cap, and reset before the 503 was read
        return None


@pytest.fixture
def edge_connections(monkeypatch) -> list[edge._Connections]:
    """The edge's own count of connections of each server the test starts, the latest last: what a
    test waits on to know the server has seen its connections open, go idle, or close."""
    registries: list[edge._Connections] = []
    make = edge.edge_protocol

    def capturing(limits: edge.EdgeLimits) -> type[edge.EdgeProtocol]:
        protocol = make(limits)
        registries.append(protocol.registry)
        return protocol

    monkeypatch.setattr(edge, "edge_protocol", capturing)
    return registries


def _seen(read: Callable[[], object]) -> object:
    """`read` of a registry the server's thread keeps changing; None while it changed under the read."""
    try:
        return read()
    except RuntimeError:  # "changed size during iteration"
        return None


def _all_idle_for(registry: edge._Connections, num: int, seconds: float) -> bool:
    """`num` connections idle, each for `seconds` at least (the test servers' loop time is monotonic)."""
    since = _seen(lambda: list(registry.idle.values()))
    return since is not None and len(since) == num and time.monotonic() - max(since) >= seconds


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while httpx.get(url + "/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the proxy did not become ready"
        time.sleep(0.05)


def test_a_100_mb_header_is_a_431_and_does_not_stall_other_clients(fake_upstream):
    """Was: two 100 MB headers took 37.6 s to process, and /health/ready failed meanwhile."""
    with _proxy(fake_upstream) as url, ThreadPoolExecutor(2) as pool:
        _wait_ready(url)
        huge = [pool.submit(_stream_huge_header, url, 100 * 2**20) for _ in range(2)]
        with httpx.Client(base_url=url, timeout=GUARD_S) as client:
            while not all(future.done() for future in huge):
                assert client.get("/health/ready").status_code == 200
                time.sleep(0.05)
        for future in huge:
            num_sent, reply = future.result()
            error = _error(reply, 431)
            assert error["code"] == "request_header_fields_too_large"
            assert "server.max_header_bytes" in error["message"]
            assert num_sent < 50 * 2**20  # the server stopped reading: only socket buffers took more


def test_a_header_under_the_limit_is_served():
    with _proxy(max_header_bytes=4096) as url:
        assert httpx.get(url + "/health/live", headers={"x-pad": "a" * 3500}).status_code == 200
        with _connect(url) as sock:
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n")
            assert _error(_read_until_closed(sock), 431)["code"] == "request_header_fields_too_large"


def test_a_connection_that_sends_nothing_gets_a_408_and_is_closed():
    """Was: held open forever."""
    with _proxy(header_timeout_s=0.5) as url, _connect(url) as sock:
        error = _error(_read_until_closed(sock), 408)
    assert error["code"] == "request_timeout" and "server.header_timeout_s" in error["message"]


def test_headers_sent_one_byte_at_a_time_are_cut_at_the_header_deadline():
    """Was: a slowloris client held the connection as long as it liked."""
    request = b"GET /health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with _proxy(header_timeout_s=0.5) as url, _connect(url) as sock:
        num_sent = 0
        while num_sent < len(request) and not select.select([sock], [], [], 0.2)[0]:
            num_sent += sock.send(request[num_sent : num_sent + 1])
        error = _error(_read_until_closed(sock), 408)
    assert error["code"] == "request_timeout"
    assert num_sent < len(request)  # 240 bytes at 5 a second would have taken 48 s


def test_an_idle_keep_alive_connection_is_closed_quietly():
    with _proxy(keepalive_timeout_s=0.5, header_timeout_s=5) as url, _connect(url) as sock:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        assert _read_until_closed(sock) == b""  # closed, and no 408 on a connection that was idle


def test_a_keep_alive_connection_serves_several_requests():
    with _proxy(header_timeout_s=5) as url, httpx.Client(base_url=url) as client:
        for _ in range(5):
            assert client.get("/health/live").status_code == 200


def test_at_the_connection_cap_idle_connections_make_room_for_real_requests(
    fake_upstream, monkeypatch, edge_connections
):
    """Was: 1,000 idle connections starved every normal request."""
    monkeypatch.setattr(edge, "IDLE_GRACE_S", 0.2)
    # a header deadline no machine reaches: the held connections end only when made room for
    with _proxy(fake_upstream, max_connections=20, header_timeout_s=3600) as url, ExitStack() as held:
        registry = edge_connections[-1]
        idle = [held.enter_context(_connect(url)) for _ in range(40)]
        for sock in idle[::2]:
            sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")  # a head that never ends

        # the cap is full of idle connections (the other 20 were refused, or made room for), each idle
        # past the (lowered) grace; the newcomers below are never closed for one another: there are
        # fewer of them than held connections, all idle for longer
        def cap_full_of_idle() -> bool:
            return registry.num_open == 20 and _all_idle_for(registry, 20, edge.IDLE_GRACE_S)

        assert wait_until(cap_full_of_idle, timeout_s=GUARD_S), (registry.num_open, len(registry.idle))
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=GUARD_S)

        def ask(i: int) -> str:
            messages = [{"role": "user", "content": f"hello {i}"}]
            return client.chat.completions.create(model="fake-small", messages=messages).choices[0].message.content

        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(ask, range(10)))
        assert all(answers)

        def num_still_open() -> int:  # the held ones: refused and closed ones are readable
            return len([sock for sock in idle if not select.select([sock], [], [], 0)[0]])

        # the oldest idle ones were closed to admit the newcomers (their closing reaches us a moment later)
        assert wait_until(lambda: num_still_open() < 20, timeout_s=GUARD_S), num_still_open()


@pytest.fixture
def bodies_never_slow(monkeypatch):
    """The busy connection's body stays unfinished: it must never count as a trickle to close."""
    monkeypatch.setattr(edge, "SLOW_BODY_GRACE_S", 3600.0)


def test_at_the_connection_cap_with_none_idle_a_newcomer_gets_a_503(bodies_never_slow):
    with _proxy(max_connections=1) as url, _connect(url) as busy:
        busy.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
        )
        assert busy.recv(65536).startswith(b"HTTP/1.1 100")  # the app reads the body: this connection is busy
        busy.sendall(b"{")
        with _connect(url) as newcomer:
            error = _error(_read_until_closed(newcomer), 503)
        assert error["code"] == "too_many_connections" and error["type"] == "server_error"


def test_a_newcomer_refused_at_the_cap_reads_its_503_though_it_sent_a_request(
    bodies_never_slow, edge_connections, monkeypatch
):
    """Was: a reset (ECONNRESET), 20 times in 20, when the request was on its way before the refusal."""
    # the refusal lingers long enough for a busy machine's pause between connect and send
    monkeypatch.setattr(edge, "REFUSAL_LINGER_S", 2.0)
    with _proxy(max_connections=1) as url, _connect(url) as busy, ExitStack() as newcomers:
        registry = edge_connections[-1]
        busy.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
        )
        assert busy.recv(65536).startswith(b"HTTP/1.1 100")
        refused = [newcomers.enter_context(_connect(url)) for _ in range(5)]
        for newcomer in refused:
            newcomer.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")

        def done_with_them() -> bool:  # and closed them: when a reset would have come
            return registry.num_open == 1 and registry.num_lingering_refusals == 0

        assert wait_until(done_with_them, timeout_s=GUARD_S), (registry.num_open, registry.num_lingering_refusals)
        for newcomer in refused:
            error = _error(_read_until_closed(newcomer), 503)
            assert error["code"] == "too_many_connections"


def test_at_the_connection_cap_trickling_bodies_make_room_for_real_requests(
    fake_upstream, monkeypatch, edge_connections
):
    """Was: 1,000 connections sending a body at 1 byte/s held every slot until body_timeout_s."""
    monkeypatch.setattr(edge, "SLOW_BODY_GRACE_S", 0.2)
    # the newcomers below are never closed for one another, however long one waits to send its request
    monkeypatch.setattr(edge, "IDLE_GRACE_S", 3600.0)
    # a body deadline no machine reaches: the trickles end only when made room for
    with _proxy(fake_upstream, max_connections=20, body_timeout_s=3600) as url, ExitStack() as held:
        registry = edge_connections[-1]
        trickling = [held.enter_context(_connect(url)) for _ in range(20)]
        for sock in trickling:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000\r\n\r\n"
            )
            assert sock.recv(65536).startswith(b"HTTP/1.1 100")  # its head is in: the app waits for the body
            sock.sendall(b"{")

        def trickles() -> bool:  # each body's byte read, and past the (lowered) grace: each is a trickle
            bodies = _seen(lambda: [(conn.body_started_at, conn.body_bytes) for conn in list(registry.in_body)])
            now = time.monotonic()
            return bodies is not None and len(bodies) == 20 and all(n == 1 and now - t >= 0.2 for t, n in bodies)

        assert wait_until(trickles, timeout_s=GUARD_S)
        # no keep-alive: an SDK connection idle in its pool would be closed first to make room
        http = held.enter_context(httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=GUARD_S))
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, http_client=http)

        def ask(i: int) -> str:
            messages = [{"role": "user", "content": f"hello {i}"}]
            return client.chat.completions.create(model="fake-small", messages=messages).choices[0].message.content

        with ThreadPoolExecutor(10) as pool:
            assert all(pool.map(ask, range(10)))
        closed: list[socket.socket] = []

        def some_closed() -> bool:  # their closing reaches us a moment later
            closed.extend(s for s in trickling if s not in closed and select.select([s], [], [], 0)[0])
            return bool(closed)

        assert wait_until(some_closed, timeout_s=GUARD_S)
        assert all(sock.recv(65536) == b"" for sock in closed)  # trickles were closed (with nothing written)


def test_upgrade_requests_do_not_use_up_the_connection_cap(edge_connections):
    """Was: a WebSocket upgrade left its connection counted for good; after `max_connections` of
    them every newcomer got a 503."""
    upgrade = (
        b"GET /health/live HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with _proxy(max_connections=3) as url:
        registry = edge_connections[-1]
        replies = []
        for _ in range(3):
            with _connect(url) as sock:
                sock.sendall(upgrade)
                replies.append(sock.recv(65536))
        # their closing reaches the server a moment later
        assert wait_until(lambda: registry.num_open == 0, timeout_s=GUARD_S), "upgraded connections still count"
        assert [_status(url + "/health/live") for _ in range(5)] == [200] * 5
    assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies)  # served as plain HTTP


def _answered_before_its_body(url: str, content_length: int) -> socket.socket:
    """A connection whose request (to a route that does not exist) was answered after one byte
    of its body, the rest of the body still to come."""
    sock = _connect(url)
    sock.sendall(b"POST /v1/no-such-route HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % content_length)
    assert _read_response(sock).startswith(b"HTTP/1.1 404")
    return sock


def test_the_rest_of_a_body_answered_early_is_not_taken_for_the_next_request_head():
    """Was: the rest of the body counted as the next request's head: past `max_header_bytes`, a 431
    that the connection's next request read as its answer."""
    with _proxy(max_header_bytes=4096) as url, _answered_before_its_body(url, 100_001) as sock:
        sock.sendall(b" " * 100_000)
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = _read_response(sock)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}'), reply[:300]


def test_the_rest_of_a_body_answered_early_that_never_ends_closes_the_connection_quietly():
    """Was: a 408 written onto the connection after its response, for its next request to read."""
    with _proxy(header_timeout_s=0.5) as url, _answered_before_its_body(url, 1000) as sock:
        sock.sendall(b" " * 10)  # and nothing more
        assert _read_until_closed(sock) == b""


def test_a_large_body_to_a_missing_route_leaves_the_connection_usable(edge_connections):
    """Was: the next request on the connection got a 431 meant for the rest of the body."""

    def answered_before_its_body() -> bool:  # waiting for its next request (idle), its body still unread
        return bool(_seen(lambda: set(registry.idle) & set(registry.in_body)))

    def body() -> Iterator[bytes]:
        yield b"x" * 1000
        # the rest comes after the 404, as from a client on a slower link
        assert wait_until(answered_before_its_body, timeout_s=GUARD_S)
        yield b"x" * 199_000

    with _proxy() as url, httpx.Client(base_url=url, timeout=GUARD_S) as client:
        registry = edge_connections[-1]
        headers = {"content-length": "200000"}
        assert client.post("/v1/no-such-route", content=body(), headers=headers).status_code == 404
        assert client.get("/health/live").status_code == 200
        assert client.post("/v1/no-such-route", content=b"x" * 4_000_000).status_code == 404
        assert client.get("/health/live").status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"NOT AN HTTP REQUEST\r\n\r\n",
        b"GET /health/live HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ],
    ids=["request line", "header name", "content-length", "two content-lengths"],
)
def test_the_servers_own_400s_are_openai_shaped(request_bytes):
    """Was: a plain-text "Invalid HTTP request received."."""
    with _proxy() as url, _connect(url) as sock:
        sock.sendall(request_bytes)
        error = _error(_read_until_closed(sock), 400)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_http_request"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_flood_of_malformed_requests_leaves_a_handful_of_log_lines():
    """Was: one warning per bad request, and a slow body's 50,000 lines."""
    from switchyard.proxy.log_limits import install_repeat_filter, remove_repeat_filter

    lines = _Lines()
    with _proxy(log_level="warning") as url:
        install_repeat_filter(interval_s=3600)  # one window, however long the flood takes on this machine
        logging.getLogger("uvicorn.error").addHandler(lines)
        try:
            for _ in range(1000):
                with _connect(url) as sock:
                    sock.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
                    assert sock.recv(12) == b"HTTP/1.1 400"
        finally:
            logging.getLogger("uvicorn.error").removeHandler(lines)
            remove_repeat_filter()
    invalid = [record for record in lines.records if "Invalid HTTP request" in record.getMessage()]
    assert len(invalid) == 1


def test_connections_the_server_closed_do_not_count_against_the_cap(edge_connections):
    with _proxy(max_connections=3, header_timeout_s=0.3) as url:
        registry = edge_connections[-1]
        for _ in range(3):  # each round's connections time out and are closed
            socks = [_connect(url) for _ in range(3)]
            for sock in socks:
                _error(_read_until_closed(sock), 408)
                sock.close()
            # their closing reaches the server a moment later (as does the probe's, before the next round)
            assert wait_until(lambda: registry.num_open == 0, timeout_s=GUARD_S), "closed connections still count"
            assert _status(url + "/health/live") == 200
            assert wait_until(lambda: registry.num_open == 0, timeout_s=GUARD_S)


def _num_unanswered(socks: list[socket.socket]) -> int:
    """Those of `socks` with nothing to read (poll, not select: their descriptors may pass 1,024)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return len(socks) - len(poller.poll(0))


@pytest.mark.slow
def test_under_a_low_open_file_limit_idle_connections_do_not_starve_requests(tmp_path, fake_upstream):
    """Was: under a 1,024 file-descriptor limit, 0 of 10 normal requests succeeded while one client
    held 1,000+ idle connections. Here the server runs with a limit of 256 and 400 are held."""
    import subprocess
    import sys

    script = tmp_path / "serve.py"
    script.write_text(
        "import resource, sys, time\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
        "from switchyard.core.settings import Settings\n"
        "from switchyard.proxy.app import create_app\n"
        "from tests.fakes.server import serve_in_thread\n"
        "models = [{'name': 'fake-small', 'base_url': sys.argv[1]}]\n"
        "settings = Settings(models=models, server={'header_timeout_s': 60}, billing={'ledger_path': None})\n"
        "with serve_in_thread(create_app(settings)) as url:\n"
        "    print(url, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    command = [sys.executable, str(script), fake_upstream]
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = server.stdout.readline().strip()
        assert url.startswith("http://"), "the server did not start"
        _wait_ready(url)
        with ExitStack() as held:
            socks = [held.enter_context(_connect(url)) for _ in range(400)]
            # the server has seen all 400 once only those it holds are unanswered (the rest were
            # refused with a 503, or closed to make room): from then on, wait past the edge's grace
            cap = edge.effective_max_connections(Settings().server.max_connections, nofile=256)
            assert wait_until(lambda: _num_unanswered(socks) == cap, timeout_s=60), _num_unanswered(socks)
            time.sleep(edge.IDLE_GRACE_S + 0.5)  # not a bound: each held connection is idle for longer
            statuses: list[int] = []

            def probe() -> None:
                statuses.append(httpx.get(url + "/health/ready", timeout=GUARD_S).status_code)

            threads = [threading.Thread(target=probe) for _ in range(10)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert statuses == [200] * 10
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        server.stdout.close()
