"""The guard between `switchyard serve` and its private valkey-server (see private_valkey.py).

Run as a script by path (`python valkey_guard.py LOCK SOCKET -- valkey-server ARGS…`), standard
library only, so it starts in a few milliseconds and imports nothing of the proxy's. It:

1. takes LOCK (flock) for as long as it lives, so two proxies never run a server on one folder:
   when another process holds it, it prints `busy PID` and exits 75;
2. starts the server as its child (on Linux with PR_SET_PDEATHSIG, so the server is stopped even
   if the guard itself is killed), waits until it answers PING on SOCKET and prints `ready PID`
   (or `failed REASON` and exits 1);
3. stops the server (SIGTERM: Valkey fsyncs its append-only file and exits) when its stdin reaches
   end of file, which happens when the proxy closes the pipe or dies in any way, SIGKILL included;
   or when it gets SIGTERM itself. It exits when the server has.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time

BUSY_EXIT = 75  # EX_TEMPFAIL
READY_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None  # looked up before any fork


def _die_with_parent() -> None:  # in the child, between fork and exec: SIGTERM when the guard dies
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers_ping(socket_path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(socket_path)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _report(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    lock_path, socket_path, separator, *server_argv = argv
    if separator != "--" or not server_argv:
        _report("failed usage: valkey_guard.py LOCK SOCKET -- valkey-server ARGS")
        return 2
    lock = open(lock_path, "a+")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        _report(f"busy {lock.read().strip() or '?'}")
        return BUSY_EXIT
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # left by a server that was killed
    server = subprocess.Popen(
        server_argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent
    )

    def stop(*_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the proxy decides when its Valkey stops
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers_ping(socket_path):
        if server.poll() is not None:
            _report(f"failed valkey-server exited with code {server.returncode}")
            return 1
        if time.monotonic() > deadline:
            stop()
            server.wait()
            _report(f"failed valkey-server did not answer within {READY_TIMEOUT_S:g} s")
            return 1
        time.sleep(0.01)
    _report(f"ready {server.pid}")

    def stop_at_end_of_input() -> None:
        while sys.stdin.buffer.read(4096):
            pass
        stop()

    threading.Thread(target=stop_at_end_of_input, daemon=True).start()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
