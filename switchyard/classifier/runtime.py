"""Scoring prompts inside the proxy: micro-batched, cached, on a worker thread, with a deadline.

One worker thread scores one batch at a time; the event loop only waits on futures. A prompt
that finds the worker idle starts a batch after at most `max_wait_ms` (default 0: at once);
prompts that arrive while the worker is busy queue, and all of them (up to `max_batch`) go as the
next batch the moment the worker is free. So a quiet proxy adds no batching delay and a busy one
scores in large batches, whose cost per prompt is several times lower. Scores are kept in an LRU
cache by a hash of the prompt. A caller that cannot wait longer than its deadline gets a
`ScoreUnavailable` and routes by its default, saying so.

The scorer returns one score a prompt, or one row a prompt (routing by value: the score, then
each tier's predicted quality); `score` gives the first value, `scores` the whole row.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

import numpy as np
from threadpoolctl import ThreadpoolController

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
        max_wait_ms: float = 0.0,
        cache_size: int = 10_000,
        blas_threads: int | None = 1,
    ) -> None:
        self._score_batch = score_batch
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.cache_size = cache_size
        self._blas_threads = blas_threads
        self._cache: OrderedDict[str, tuple[float, ...]] = OrderedDict()
        self._queued: dict[str, str] = {}  # key -> text, waiting for the worker
        self._futures: dict[str, asyncio.Future[tuple[float, ...]]] = {}  # key -> its row, queued or being scored
        self._timer: asyncio.TimerHandle | None = None
        self._batch_task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="classifier")
        # Found now, not at the first batch: importing threadpoolctl and scanning the loaded libraries
        # on the worker took ~100 ms, over the routing deadline (the first request routed by default).
        self._threadpools = ThreadpoolController() if blas_threads is not None else None
        self.num_batches = 0
        self.num_scored = 0
        self._is_retiring = False  # close once nothing waits for a score

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    async def score(self, text: str, deadline_s: float) -> float:
        return (await self.scores(text, deadline_s))[0]

    async def scores(self, text: str, deadline_s: float) -> tuple[float, ...]:
        """The prompt's whole row (one value for a scorer of one score a prompt)."""
        key = self._key(text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        future = self._futures.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = self._futures[key] = loop.create_future()
            self._queued[key] = text
            if self._batch_task is None:  # the worker is idle; if busy, its batch's end starts ours
                if len(self._queued) >= self.max_batch:
                    self._start_batch()
                elif self._timer is None:
                    self._timer = loop.call_later(self.max_wait_s, self._start_batch)
        try:
            # shield: one caller's deadline must not cancel a score other callers share.
            return await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except TimeoutError:
            raise ScoreUnavailable(f"classifier late (>{deadline_s * 1000:.0f}ms)") from None

    def _start_batch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._batch_task is not None or not self._queued:
            return
        keys = list(islice(self._queued, self.max_batch))
        batch = [(key, self._queued.pop(key)) for key in keys]
        self._batch_task = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[str, str]]) -> None:
        texts = [text for _, text in batch]
        try:
            scores = await asyncio.get_running_loop().run_in_executor(self._executor, self._score_on_worker, texts)
            if len(scores) != len(texts):
                raise ValueError(f"the scorer returned {len(scores)} scores for {len(texts)} prompts")
        except Exception as exc:  # a scorer bug must not take routing down: callers fall back
            logger.exception("classifier failed on a batch of %d", len(texts))
            self._settle(batch, ScoreUnavailable(f"classifier failed ({type(exc).__name__})"))
        except asyncio.CancelledError:
            self._settle(batch, ScoreUnavailable("classifier stopped"))
            raise
        else:
            self.num_batches += 1
            self.num_scored += len(texts)
            self._settle(batch, scores)
        finally:
            self._batch_task = None
        if self._queued:  # what arrived while the worker was busy goes now, as one batch
            self._start_batch()
        elif self._is_retiring:
            self.close()

    def _settle(self, batch: list[tuple[str, str]], outcome: np.ndarray | Exception) -> None:
        """Each text of `batch` gets its row from `outcome`, or `outcome` as its error."""
        rows = None if isinstance(outcome, Exception) else np.asarray(outcome).reshape(len(batch), -1).tolist()
        for i, (key, _) in enumerate(batch):
            future = self._futures.pop(key)
            if rows is None:
                assert isinstance(outcome, Exception)
                if not future.done():
                    future.set_exception(outcome)
                    future.exception()  # retrieved: a caller that already left must not log it as lost
            else:
                value = tuple(rows[i])
                self._remember(key, value)
                if not future.done():
                    future.set_result(value)

    def _score_on_worker(self, texts: list[str]) -> np.ndarray:
        # The worker shares the machine's cores with the event loop; BLAS threads spinning on the
        # head's small matrices cost more than they save (2x on a batch of 32 on 2 cores).
        if self._blas_threads is None:
            return self._score_batch(texts)
        assert self._threadpools is not None
        with self._threadpools.limit(limits=self._blas_threads, user_api="blas"):
            return self._score_batch(texts)

    def _remember(self, key: str, value: tuple[float, ...]) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def close_when_idle(self) -> None:
        """Close once every prompt queued or being scored has its score (a reload replaced this
        classifier: the requests already asking still get their answer)."""
        self._is_retiring = True
        if self._batch_task is None and not self._queued:
            self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._executor.shutdown(wait=False, cancel_futures=True)
