from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from classifier.runtime import MicroBatcher, ScoreUnavailable


class Recorder:
    """A scoring function that records its batches and the thread it ran on."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.fail = fail

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("boom")
        return np.array([len(t) / 100 for t in texts])


async def test_requests_close_together_share_one_batch_off_the_loop():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_batch=32, max_wait_ms=20)
    texts = [f"prompt {'x' * i}" for i in range(10)]
    scores = await asyncio.gather(*(batcher.score(t, 1.0) for t in texts))
    assert scores == [len(t) / 100 for t in texts]
    assert len(recorder.batches) == 1 and len(recorder.batches[0]) == 10
    assert recorder.threads and threading.main_thread().name not in recorder.threads
    batcher.close()


async def test_a_full_batch_goes_at_once():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_batch=4, max_wait_ms=10_000)
    await asyncio.wait_for(asyncio.gather(*(batcher.score(f"t{i}", 5.0) for i in range(8))), 2.0)
    assert [len(b) for b in recorder.batches] == [4, 4]
    batcher.close()


async def test_cache_and_in_flight_sharing():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_wait_ms=5)
    first = await asyncio.gather(*(batcher.score("same", 1.0) for _ in range(5)))
    again = await batcher.score("same", 1.0)
    assert first == [0.04] * 5 and again == 0.04
    assert recorder.batches == [["same"]]
    batcher.close()


async def test_lru_evicts_the_oldest():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_wait_ms=1, cache_size=2)
    for text in ("a", "b", "c", "a"):
        await batcher.score(text, 1.0)
    assert [b for batch in recorder.batches for b in batch] == ["a", "b", "c", "a"]
    batcher.close()


async def test_late_scores_raise_and_are_still_cached():
    recorder = Recorder(delay_s=0.2)
    batcher = MicroBatcher(recorder, max_wait_ms=1)
    with pytest.raises(ScoreUnavailable, match=r"classifier late \(>50ms\)"):
        await batcher.score("slow", 0.05)
    await asyncio.sleep(0.3)
    assert await batcher.score("slow", 0.05) == 0.04
    assert len(recorder.batches) == 1
    batcher.close()


async def test_a_failing_scorer_is_reported_not_raised_raw():
    batcher = MicroBatcher(Recorder(fail=True), max_wait_ms=1)
    with pytest.raises(ScoreUnavailable, match=r"classifier failed \(RuntimeError\)"):
        await batcher.score("x", 1.0)
    batcher.close()
