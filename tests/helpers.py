from __future__ import annotations

import socket
import time
from collections.abc import Callable

import orjson

# Bounds a model's load (the first start converts its weights): minutes on a 2-core machine beside
# other work, never a hang. What a test waits for is the model saying it is ready.
MODEL_LOAD_BOUND_S = 900.0

# Bounds a `switchyard` process's start or exit (it imports torch and transformers: seconds here, a
# minute or more on a slower machine under the suite's load), never a hang. What a test waits for is
# the process answering /health/live, or exiting.
PROCESS_BOUND_S = 600.0


def wait_until(predicate: Callable[[], object], timeout_s: float = 30.0, interval_s: float = 0.01) -> bool:
    """Poll `predicate` until it is truthy or `timeout_s` passes; return whether it became true.
    The deadline only bounds a hang: a condition that holds returns at once."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def post_unread(base: str, body: dict, headers: dict[str, str]) -> socket.socket:
    """A raw connection on which a POST of `body` to /v1/chat/completions was sent, its answer
    unread: closing it is a client that leaves."""
    host, port = base.removeprefix("http://").split(":")
    payload = orjson.dumps(body)
    head = [f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"]
    head += [f"content-length: {len(payload)}\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall("".join(head).encode() + payload)
    return sock


def read_ledger(app_or_url, **filters) -> list:
    """The usage records of a running (or stopped) proxy's database, read from this thread.

    `app_or_url`: the app (its settings name the database) or a database url; `filters`:
    request_id= or client_request_id= (see `Database.read_usage`).
    """
    import asyncio

    from switchyard.billing.store import open_database

    url = (
        app_or_url
        if isinstance(app_or_url, str)
        else app_or_url.state.services.settings.billing.resolved_database_url()
    )

    async def read() -> list:
        database = await open_database(url)
        try:
            return await database.read_usage(**filters)
        finally:
            await database.aclose()

    return asyncio.run(read())


def wait_for_records(app_or_url, count: int, timeout_s: float = 30.0, **filters) -> list:
    """At least `count` records matching `filters`, once the ledger has written them."""
    assert wait_until(lambda: len(read_ledger(app_or_url, **filters)) >= count, timeout_s=timeout_s), read_ledger(
        app_or_url, **filters
    )
    return read_ledger(app_or_url, **filters)


async def async_wait_until(predicate: Callable[[], object], timeout_s: float = 30.0, interval_s: float = 0.01) -> bool:
    """`wait_until` for a test on the event loop: polls without blocking the loop (so the work it
    waits for can run); returns whether `predicate` became true. The deadline only bounds a hang."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval_s)
    return bool(predicate())
