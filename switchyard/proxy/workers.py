"""`switchyard serve --workers N`: N worker processes serving one port.

The parent binds the listening socket once, sets PROMETHEUS_MULTIPROC_DIR to a fresh folder (the
metrics' multiprocess mode, see core/metrics.py) and starts the workers (multiprocessing's spawn),
which each load their own app and run `GracefulServer` on the shared socket; the kernel hands each
new connection to one of them. State the workers must share (budgets, rate limits, keys) lives in
Valkey and the database, which is why more than one worker needs Valkey: `billing.redis_url`, or
the private Valkey `switchyard serve` starts before this and hands them as that URL.

SIGINT or SIGTERM to the parent is passed to every worker once, as SIGTERM: each stops accepting,
ends its streams in-band, lets its requests finish and flushes its ledger, as a single process
does; the parent waits for them and exits 0 (a second signal kills them at once). A worker that
dies otherwise is started again in its slot, with the same spill file, which it replays; but one
that dies before any worker has finished its start (the database unreachable, say) stops them all,
and `serve` returns uvicorn's startup-failure code, 3, as one process exits with.

SIGHUP to the parent is passed to every worker: each reloads its routing files
(`switchyard.gateway.reload`). `POST /admin/reload` reloads the worker that took it, then sends
the parent SIGHUP, so every worker reloads (one whose files are unchanged keeps what it runs).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event as ProcessEvent
from types import FrameType

from uvicorn.config import STARTUP_FAILURE

from switchyard.billing.ledger import adopt_spill_files, worker_spill_path
from switchyard.core.metrics import MULTIPROCESS_ENV
from switchyard.core.settings import Settings
from switchyard.gateway.gauges import retire_process
from switchyard.proxy.streams import GracefulServer

logger = logging.getLogger("switchyard.workers")

MIN_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 10.0
STABLE_AFTER_S = 30.0  # a worker that ran this long before dying is restarted without delay
PARENT_CHECK_TICKS = 10  # uvicorn ticks every 0.1 s: a worker checks its parent is alive each second

_spawn = multiprocessing.get_context("spawn")


def serve(settings: Settings, num_workers: int) -> int:
    """Run `num_workers` workers on `settings.server`'s address until SIGINT/SIGTERM; the exit code:
    0, or STARTUP_FAILURE when a worker died before any had started."""
    sock = bind_socket(settings.server.host, settings.server.port)  # first: a server running there keeps its files
    base_spill = settings.billing.spill_path.expanduser()
    try:
        adopt_spill_files(base_spill, worker_spill_path(base_spill, 0))  # before any worker writes
    except BaseException:
        sock.close()
        raise
    metrics_dir = tempfile.mkdtemp(prefix="switchyard-metrics-")
    os.environ[MULTIPROCESS_ENV] = metrics_dir  # inherited by each worker before it imports prometheus_client
    supervisor = _Supervisor(settings, num_workers, sock, metrics_dir)
    try:
        return supervisor.run()
    finally:
        sock.close()
        os.environ.pop(MULTIPROCESS_ENV, None)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


@dataclass
class _Slot:
    index: int
    process: SpawnProcess
    started_at: float
    num_quick_deaths: int = 0


class _Supervisor:
    def __init__(self, settings: Settings, num_workers: int, sock: socket.socket, metrics_dir: str) -> None:
        self.settings = settings
        self.metrics_dir = metrics_dir
        self.num_workers = num_workers
        self.sock = sock
        self.slots: list[_Slot] = []
        self.stopping = threading.Event()
        self.num_signals = 0
        self.booted = _spawn.Event()  # set by the first worker that finishes its start
        self.exit_code = 0

    def run(self) -> int:
        host, port = self.sock.getsockname()[:2]
        logger.info("switchyard: %d workers on http://%s:%d (parent pid %d)", self.num_workers, host, port, os.getpid())
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            self.slots = [self._start(index) for index in range(self.num_workers)]
            while not self.stopping.wait(0.2):
                for slot in self.slots:
                    if slot.process.is_alive() or self.stopping.is_set():
                        continue
                    if self.booted.is_set():
                        self._restart(slot)
                    else:  # it would only fail again: a restart is for a server that has worked
                        self._give_up(slot)
            self._signal_workers(signal.SIGKILL if self.num_signals > 1 else signal.SIGTERM)  # one started meanwhile
            for slot in self.slots:
                slot.process.join()
                self._retire(slot.process)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.exit_code

    def _start(self, index: int) -> _Slot:
        process = _spawn.Process(
            target=_worker_main,
            args=(self.settings, index, self.sock, os.getpid(), self.booted),
            name=f"switchyard-worker-{index}",
        )
        process.start()
        logger.info("worker %d started (pid %d)", index, process.pid)
        return _Slot(index, process, time.monotonic())

    def _retire(self, process: SpawnProcess) -> None:
        if process.pid is not None:  # None only for a process never started, which left nothing
            retire_process(process.pid, self.metrics_dir)

    def _give_up(self, slot: _Slot) -> None:
        slot.process.join()
        logger.error(
            "switchyard: worker %d (pid %d) could not start (exit code %s); stopping",
            slot.index,
            slot.process.pid,
            slot.process.exitcode,
        )
        self.exit_code = STARTUP_FAILURE
        self.stopping.set()

    def _restart(self, slot: _Slot) -> None:
        process = slot.process
        lived_s = time.monotonic() - slot.started_at
        process.join()
        self._retire(process)
        num_quick_deaths = 0 if lived_s >= STABLE_AFTER_S else slot.num_quick_deaths + 1
        delay_s = min(MAX_RESTART_DELAY_S, MIN_RESTART_DELAY_S * 2 ** (num_quick_deaths - 1)) if num_quick_deaths else 0
        logger.error(
            "worker %d (pid %d) exited with code %s after %.0f s; starting it again%s",
            slot.index,
            process.pid,
            process.exitcode,
            lived_s,
            f" in {delay_s:g} s" if delay_s else "",
        )
        if self.stopping.wait(delay_s):
            return
        fresh = self._start(slot.index)
        fresh.num_quick_deaths = num_quick_deaths
        self.slots[slot.index] = fresh

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.num_signals += 1
        self.stopping.set()
        if self.num_signals == 1:
            logger.info("switchyard: stopping %d workers (they finish their requests)", self.num_workers)
        self._signal_workers(signal.SIGKILL if self.num_signals > 1 else signal.SIGTERM)

    def _on_hangup(self, sig: int, frame: FrameType | None) -> None:
        logger.info("switchyard: SIGHUP, the %d workers reload their routing files", self.num_workers)
        self._signal_workers(signal.SIGHUP)

    def _signal_workers(self, sig: int) -> None:
        """Each worker's stop is idempotent: a second SIGTERM changes nothing."""
        for slot in self.slots:
            if slot.process.pid is not None and slot.process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, sig)


class WorkerServer(GracefulServer):
    """A worker's server: a signal only ever asks for the graceful stop (the terminal's Ctrl-C
    reaches the workers as well as the parent, which passes it on), and the worker stops by itself
    if its parent is gone."""

    parent_pid = 0
    booted: ProcessEvent | None = None  # the supervisor's Event, set once this worker's start is done

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.booted is not None:
            self.booted.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if counter % PARENT_CHECK_TICKS == 0 and os.getppid() != self.parent_pid:
            logger.warning("worker pid %d: the parent process is gone; stopping", os.getpid())
            self.should_exit = True
        return await super().on_tick(counter)


def _worker_main(settings: Settings, index: int, sock: socket.socket, parent_pid: int, booted: ProcessEvent) -> None:
    from switchyard.gateway.request_log import install_request_log_handler
    from switchyard.proxy.app import create_app
    from switchyard.proxy.edge import raise_nofile_limit, uvicorn_config
    from switchyard.proxy.log_limits import install_repeat_filter

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until its app reloads on it: a reload must not kill a worker
    settings.billing.spill_path = worker_spill_path(settings.billing.spill_path.expanduser(), index)
    app = create_app(settings, reload_signal=True, reload_parent_pid=parent_pid)
    raise_nofile_limit()  # each worker has its own open-file table, so its own connection cap
    config = uvicorn_config(app, settings.server)
    install_repeat_filter()
    install_request_log_handler(settings.logging)
    server = WorkerServer(config)
    server.parent_pid = parent_pid
    server.booted = booted
    server.run(sockets=[sock])
