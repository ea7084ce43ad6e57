"""The streams being relayed right now, so that a shutting-down server can end them properly.

When the server starts shutting down (`switchyard.proxy.streams.GracefulServer`, before uvicorn's
grace period), each live stream is interrupted: it sends an in-band error saying the server is
shutting down, then its end (`[DONE]`), and is metered as cancelled with the tokens it sent, instead
of being cut mid-answer when the grace period runs out.
"""

from __future__ import annotations

import asyncio


class LiveStreams:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self._ending: set[asyncio.Task] = set()

    def add(self, task: asyncio.Task | None) -> None:
        if task is not None:
            self._tasks.add(task)

    def discard(self, task: asyncio.Task | None) -> None:
        self._tasks.discard(task)
        self._ending.discard(task)

    def is_ending(self, task: asyncio.Task | None) -> bool:
        """Was this stream interrupted by `end_all` (and not by anything else since)?"""
        return task in self._ending and task is not None and task.cancelling() == 1

    def end_all(self) -> int:
        """Interrupt every live stream; each ends itself with an error event and [DONE]."""
        for task in self._tasks - self._ending:
            self._ending.add(task)
            task.cancel()
        return len(self._ending)
