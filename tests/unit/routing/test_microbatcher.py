from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from switchyard.classifier.runtime import MicroBatcher, ScoreUnavailable
from tests.helpers import async_wait_until

WAIT_S = 30.0  # a generous bound on anything the tests wait for: it only catches a hang


class Recorder:
    """A scoring function that records its batches and the thread it ran on.

    `gated`: each batch waits on the worker until the test opens `gate`, so the test decides how
    long the worker stays busy, not the machine's speed.
    """

    def __init__(self, gated: bool = False, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.fail = fail
        self.started = threading.Event()  # set when the first batch reaches the worker

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.threads.add(threading.current_thread().name)
        self.started.set()
        self.gate.wait(WAIT_S)
        if self.fail:
            raise RuntimeError("boom")
        return np.array([len(t) / 100 for t in texts])


async def _worker_started(recorder: Recorder) -> None:
    assert await asyncio.to_thread(recorder.started.wait, WAIT_S)


async def test_requests_close_together_share_one_batch_off_the_loop():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_batch=32, max_wait_ms=20)
    texts = [f"prompt {'x' * i}" for i in range(10)]
    scores = await asyncio.gather(*(batcher.score(t, WAIT_S) for t in texts))
    assert scores == [len(t) / 100 for t in texts]
    assert len(recorder.batches) == 1 and len(recorder.batches[0]) == 10
    assert recorder.threads and threading.main_thread().name not in recorder.threads
    batcher.close()


async def test_a_full_batch_goes_at_once():
    recorder = Recorder()
    # A window far longer than the test's bound: a full batch that waited for the timer would hang.
    batcher = MicroBatcher(recorder, max_batch=4, max_wait_ms=3_600_000)
    await asyncio.wait_for(asyncio.gather(*(batcher.score(f"t{i}", WAIT_S) for i in range(8))), WAIT_S)
    assert [len(b) for b in recorder.batches] == [4, 4]
    batcher.close()


async def test_cache_and_in_flight_sharing():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_wait_ms=5)
    first = await asyncio.gather(*(batcher.score("same", WAIT_S) for _ in range(5)))
    again = await batcher.score("same", WAIT_S)
    assert first == [0.04] * 5 and again == 0.04
    assert recorder.batches == [["same"]]
    batcher.close()


async def test_lru_evicts_the_oldest():
    recorder = Recorder()
    batcher = MicroBatcher(recorder, max_wait_ms=1, cache_size=2)
    for text in ("a", "b", "c", "a"):
        await batcher.score(text, WAIT_S)
    assert [b for batch in recorder.batches for b in batch] == ["a", "b", "c", "a"]
    batcher.close()


async def test_late_scores_raise_and_are_still_cached():
    recorder = Recorder(gated=True)  # late for sure: the score comes only once the test opens the gate
    batcher = MicroBatcher(recorder, max_wait_ms=1)
    with pytest.raises(ScoreUnavailable, match=r"classifier late \(>50ms\)"):
        await batcher.score("slow", 0.05)
    recorder.gate.set()
    assert await async_wait_until(lambda: batcher.num_batches == 1)  # the late score has come in
    assert await batcher.score("slow", 0.05) == 0.04
    assert len(recorder.batches) == 1
    batcher.close()


async def test_a_failing_scorer_is_reported_not_raised_raw():
    batcher = MicroBatcher(Recorder(fail=True), max_wait_ms=1)
    with pytest.raises(ScoreUnavailable, match=r"classifier failed \(RuntimeError\)"):
        await batcher.score("x", WAIT_S)
    batcher.close()


async def test_prompts_arriving_while_the_worker_is_busy_go_together_as_soon_as_it_is_free():
    recorder = Recorder(gated=True)  # the worker stays busy with the first until the test lets it go
    batcher = MicroBatcher(recorder, max_batch=32, max_wait_ms=0)
    first = asyncio.ensure_future(batcher.score("first", WAIT_S))
    await _worker_started(recorder)  # the worker has the first prompt
    # A window far longer than the test's own bound: batches must start on the worker, not the timer.
    batcher.max_wait_s = 3600.0
    rest = [f"later {i}" for i in range(5)]
    later = [asyncio.ensure_future(batcher.score(t, WAIT_S)) for t in rest]
    assert await async_wait_until(lambda: len(batcher._queued) == 5)  # queued while the worker is busy
    recorder.gate.set()
    scores = await asyncio.wait_for(asyncio.gather(first, *later), WAIT_S)
    assert scores == [len(t) / 100 for t in ["first", *rest]]
    assert recorder.batches == [["first"], rest]
    batcher.close()


async def test_an_idle_worker_starts_at_once_by_default():
    recorder = Recorder()
    batcher = MicroBatcher(recorder)
    assert batcher.max_wait_s == 0
    for text in ("a", "b"):
        assert await asyncio.wait_for(batcher.score(text, WAIT_S), WAIT_S) == 0.01
    assert recorder.batches == [["a"], ["b"]]
    batcher.close()


async def test_a_busy_queue_larger_than_a_batch_is_split():
    recorder = Recorder(gated=True)
    batcher = MicroBatcher(recorder, max_batch=3)
    first = asyncio.ensure_future(batcher.score("x", WAIT_S))
    await _worker_started(recorder)
    later = [asyncio.ensure_future(batcher.score(f"t{i}", WAIT_S)) for i in range(7)]
    assert await async_wait_until(lambda: len(batcher._queued) == 7)  # queued while the worker is busy
    recorder.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), WAIT_S)
    assert [len(b) for b in recorder.batches] == [1, 3, 3, 1]
    batcher.close()


def test_the_worker_runs_blas_on_one_thread_and_restores_it():
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen: list[list[int]] = []
    batcher = MicroBatcher(lambda texts: seen.append(blas_threads()) or np.zeros(len(texts)))
    before = blas_threads()
    batcher._score_on_worker(["a"])
    assert seen == [[1] * len(before)] and blas_threads() == before
    batcher.close()


async def test_a_scorer_that_loses_scores_fails_its_batch_and_the_next_one_still_runs():
    batcher = MicroBatcher(lambda texts: np.zeros(len(texts) - 1) if len(texts) > 1 else np.array([0.3]))
    results = await asyncio.gather(*(batcher.score(t, WAIT_S) for t in ("a", "b")), return_exceptions=True)
    assert all(isinstance(r, ScoreUnavailable) and "ValueError" in r.reason for r in results)
    assert await batcher.score("a", WAIT_S) == 0.3  # not stuck behind the failed batch
    batcher.close()
