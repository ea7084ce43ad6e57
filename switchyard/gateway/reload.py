"""Reloading the routing files without a restart (`POST /admin/reload`, SIGHUP).

A reload reads the thresholds file(s) and classifier artifact(s) again, checks them as the start
does (`check_startup`), and swaps the running versions at once (`Services.routings`); a request
already routed keeps the version it started with. A file that cannot be used changes nothing: the
old versions go on routing and the refusal (`ReloadRefused`) says why. Files whose versions did
not change keep their running routers (and the classifier's cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from switchyard.core.errors import NotConfigured, ReloadRefused
from switchyard.core.thresholds import ThresholdsError
from switchyard.gateway.routings import Routings, build_routings, check_startup, retire
from switchyard.gateway.services import Services

logger = logging.getLogger("switchyard")


@dataclass(frozen=True, slots=True)
class Reloaded:
    """The versions before and after a reload."""

    previous: Routings
    routings: Routings

    @property
    def is_changed(self) -> bool:
        return _versions(self.previous) != _versions(self.routings)


async def reload_routing(services: Services) -> Reloaded:
    """Read the routing files again and swap the versions they make (ReloadRefused: nothing changed)."""
    parts = services.routing_parts
    if parts is None:
        raise NotConfigured("These services route nothing (an offline run): there is no routing to reload.")
    async with services.reloading:
        old = services.routings
        try:
            check = await asyncio.to_thread(check_startup, services.settings)  # file reads: off the event loop
        except ThresholdsError as exc:
            logger.error("reload refused, still routing by %s: %s", describe(old), exc)
            raise ReloadRefused(f"Reload refused, still routing by {describe(old)}: {exc}") from exc
        found = [(check.version, "current")]
        if check.candidate is not None:
            found.append((check.candidate.version, "candidate"))
        if found == _versions(old) and check.share == old.share:
            logger.info("reload: the routing files are unchanged (%s)", describe(old))
            return Reloaded(old, old)
        new = build_routings(parts, check, previous=old)
        services.routings = new
        services.routing_history.update((routing.version, routing.role) for routing in old)
        retire(old, new)
        logger.info("routing reloaded: %s -> %s", describe(old), describe(new))
        return Reloaded(old, new)


def describe(routings: Routings) -> str:
    """e.g. `v-0123456789ab` or `v-0123456789ab + candidate v-ba9876543210 (10%)`."""
    text = routings.current.version
    if routings.candidate is not None:
        text += f" + candidate {routings.candidate.version} ({routings.share:.0%})"
    return text


def _versions(routings: Routings) -> list[tuple[str, str]]:
    return [(routing.version, routing.role) for routing in routings]


@contextlib.contextmanager
def reload_on_sighup(services: Services) -> Iterator[None]:
    """While open, SIGHUP reloads the routing files (the served process only: a signal handler
    needs the main thread's event loop)."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()

    def on_hangup() -> None:
        task = loop.create_task(_reload_logged(services), name="reload:SIGHUP")
        running.add(task)
        task.add_done_callback(running.discard)

    before = signal.getsignal(signal.SIGHUP)
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if before is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGHUP, before)
        for task in running:
            task.cancel()


async def _reload_logged(services: Services) -> None:
    with contextlib.suppress(ReloadRefused):  # already logged, with the reason
        await reload_routing(services)
