"""When this process has capacity interactive traffic leaves: the one rule the batch tier's worker
and the shadow jobs (switchyard.learning) wait on.

There is room while the process serves fewer than `batch.yield_at_in_flight` interactive requests,
its CPU is under `batch.yield_at_cpu` of a core while any run (the event loop is one core: what
background work takes of it, the interactive requests wait for), and no model reports saturation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from switchyard.backends.registry import ModelRegistry
from switchyard.core.settings import BatchSettings

IDLE_POLL_S = 0.05  # how often work paused by interactive traffic looks again
CPU_WINDOW_S = 0.25  # the CPU share is measured over this long


class CpuShare:
    """This process's CPU time over the last CPU_WINDOW_S of wall time, as a share of one core."""

    def __init__(self) -> None:
        self._since = (time.monotonic(), time.process_time())
        self._share = 0.0

    def share(self) -> float:
        now, cpu = time.monotonic(), time.process_time()
        wall_s = now - self._since[0]
        if wall_s >= CPU_WINDOW_S:
            self._share = (cpu - self._since[1]) / wall_s
            self._since = (now, cpu)
        return self._share


class SpareCapacity:
    """`has_room()` now, or `wait()` until there is."""

    def __init__(self, settings: BatchSettings, registry: ModelRegistry, load: Callable[[], int]) -> None:
        self.settings = settings
        self.registry = registry
        self.load = load  # interactive requests this process serves now
        self.cpu = CpuShare()

    def has_room(self) -> bool:
        load = self.load()
        cpu = self.cpu.share()
        if load >= self.settings.yield_at_in_flight or (load > 0 and cpu >= self.settings.yield_at_cpu):
            return False
        return not any(entry.backend.is_saturated() for entry in self.registry)

    async def wait(self) -> None:
        while not self.has_room():  # noqa: ASYNC110 (load and CPU are read, nothing signals them)
            await asyncio.sleep(IDLE_POLL_S)
