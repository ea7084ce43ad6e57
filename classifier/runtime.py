"""Scoring prompts inside the proxy: micro-batched, cached, on a worker thread, with a deadline.

Requests that arrive within `max_wait_ms` of each other (or until `max_batch` of them) share one
forward pass on a single worker thread; the event loop only waits on futures. Scores are kept in
an LRU cache by a hash of the prompt. A caller that cannot wait longer than its deadline gets a
`ScoreUnavailable` and routes by its default, saying so.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

logger = logging.getLogger("switchyard.classifier")


class ScoreUnavailable(Exception):
    """No score in time (or the scorer failed); `reason` says which, for the route header."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MicroBatcher:
    def __init__(
        self,
        score_batch: Callable[[list[str]], np.ndarray],
        *,
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        cache_size: int = 10_000,
    ) -> None:
        self._score_batch = score_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.cache_size = cache_size
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._pending: dict[str, tuple[str, asyncio.Future[float]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="classifier")
        self.num_batches = 0
        self.num_scored = 0

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    async def score(self, text: str, deadline_s: float) -> float:
        key = self._key(text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        entry = self._pending.get(key)
        if entry is None:
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self._pending[key] = (text, future)
            if len(self._pending) >= self.max_batch:
                self._flush()
            elif self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self.max_wait_s, self._flush)
        else:
            future = entry[1]
        try:
            # shield: one caller's deadline must not cancel a score other callers share.
            return await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except TimeoutError:
            raise ScoreUnavailable(f"classifier late (>{deadline_s * 1000:.0f}ms)") from None

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        batch, self._pending = list(self._pending.items()), {}
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: Sequence[tuple[str, tuple[str, asyncio.Future[float]]]]) -> None:
        texts = [text for _, (text, _) in batch]
        try:
            scores = await asyncio.get_running_loop().run_in_executor(self._executor, self._score_batch, texts)
        except Exception as exc:  # a scorer bug must not take routing down: callers fall back
            logger.exception("classifier failed on a batch of %d", len(texts))
            for _, (_, future) in batch:
                if not future.done():
                    future.set_exception(ScoreUnavailable(f"classifier failed ({type(exc).__name__})"))
            return
        self.num_batches += 1
        self.num_scored += len(texts)
        for (key, (_, future)), value in zip(batch, scores, strict=True):
            self._remember(key, float(value))
            if not future.done():
                future.set_result(float(value))

    def _remember(self, key: str, value: float) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
