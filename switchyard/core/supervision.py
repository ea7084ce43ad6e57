"""Background tasks that must not die quietly: a crash is logged with its traceback, the task is
restarted after a pause that grows while it keeps crashing, and `status()` says so (readiness
shows it).

    task = SupervisedTask("health-watcher", lambda: watch_health(...))
    task.start()          # inside the running loop
    task.status()         # {"state": "running", "restarts": 0, "last_error": None, ...}
    await task.aclose()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

logger = logging.getLogger("switchyard.tasks")

TaskState = Literal["not-started", "running", "restarting", "finished", "stopped"]


class SupervisedTask:
    """Runs `run()` until it returns or the task is closed; restarts it each time it raises.

    The pause before a restart starts at `min_backoff_s` and doubles up to `max_backoff_s`; a run
    that lasted longer than `max_backoff_s` resets it. `last_error` holds the exception's class
    only: readiness is public, and an exception's words may name hosts (the log has them).
    """

    def __init__(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        *,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.name = name
        self._run = run
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.state: TaskState = "not-started"
        self.num_restarts = 0
        self.last_error: str | None = None
        self.last_failed_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name=self.name)

    @property
    def is_healthy(self) -> bool:
        """Running, or ended on its own; not waiting out a crash."""
        return self.state in ("running", "finished")

    def status(self) -> dict[str, object]:
        return {
            "state": self.state,
            "restarts": self.num_restarts,
            "last_error": self.last_error,
            "last_failed_at": self.last_failed_at,
        }

    async def _supervise(self) -> None:
        backoff_s = self.min_backoff_s
        while True:
            self.state = "running"
            started_at = time.monotonic()
            try:
                await self._run()
            except Exception as exc:
                self.state = "restarting"
                self.num_restarts += 1
                self.last_error = type(exc).__name__
                self.last_failed_at = time.time()
                if time.monotonic() - started_at > self.max_backoff_s:
                    backoff_s = self.min_backoff_s
                logger.error(
                    "background task %s died (restart #%d in %g s)",
                    self.name,
                    self.num_restarts,
                    backoff_s,
                    exc_info=exc,
                )
                await asyncio.sleep(backoff_s)
                backoff_s = min(self.max_backoff_s, backoff_s * 2)
            else:
                self.state = "finished"
                return

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # our own cancellation, if any, still propagates
        self.state = "stopped"
