"""Run an ASGI app on a real socket on 127.0.0.1, in a thread with its own event loop."""

from __future__ import annotations

import asyncio
import io
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from switchyard.core.settings import ServerSettings
from switchyard.proxy.edge import uvicorn_config
from switchyard.proxy.streams import GracefulServer

_RUNNING: dict[str, uvicorn.Server] = {}


async def read_body(receive) -> bytes:
    """An ASGI request's whole body."""
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return raw


# Bounds on a hang only: a busy machine may take long to start an app (LiteLLM's import) or stop one.
STARTUP_BOUND_S = 120.0
STOP_BOUND_S = 60.0  # beyond the graceful shutdown


def stop_server(base_url: str) -> None:
    """Stop a server started by `serve_in_thread`: it stops listening at once (new connections are
    refused) and cancels what is still running after its grace (1 s unless told), cleanly."""
    _RUNNING[base_url].should_exit = True


@contextmanager
def serve_in_thread(
    app,
    *,
    server: ServerSettings | None = None,
    log_level: str = "error",
    graceful_shutdown_s: float = 1,
    access_log: bool = False,
) -> Iterator[str]:
    """Yield the base URL (``http://127.0.0.1:PORT``) while `app` is being served, with the
    production uvicorn Config (`switchyard.proxy.edge.uvicorn_config`) and `server`'s limits.
    `graceful_shutdown_s`: how long a stopping server lets requests in flight finish; `access_log`
    (with `log_level="info"`): uvicorn's access log on, as `server.access_log: true` turns it on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    if server is None:  # the proxy's own settings, else the defaults (a fake upstream)
        settings = getattr(getattr(app, "state", None), "settings", None)
        server = settings.server if settings is not None else ServerSettings()
    config = uvicorn_config(
        app,
        server,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        loop="asyncio",
        timeout_graceful_shutdown=graceful_shutdown_s,
    )
    server = GracefulServer(config)  # a plain uvicorn.Server for apps other than the proxy
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve() -> None:
        loops.append(asyncio.get_running_loop())
        await server.serve(sockets=[sock])

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_BOUND_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    _RUNNING[url] = server
    try:
        yield url
    finally:
        _RUNNING.pop(url, None)
        server.should_exit = True
        thread.join(timeout=graceful_shutdown_s + STOP_BOUND_S)
        sock.close()
        # a test that goes on reading (the ledger) while the app still shuts down would race it
        assert not thread.is_alive(), (
            f"the test server did not stop within {graceful_shutdown_s + STOP_BOUND_S:g} s; still running:\n"
            + _still_running(thread, loops)
        )


def _still_running(thread: threading.Thread, loops: list[asyncio.AbstractEventLoop]) -> str:
    """What a server that would not stop is doing: its thread's frame and its loop's tasks."""
    out = io.StringIO()
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is not None:
        traceback.print_stack(frame, file=out)
    for task in asyncio.all_tasks(loops[0]) if loops else ():
        task.print_stack(limit=12, file=out)
    return out.getvalue()
