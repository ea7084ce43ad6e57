"""A background task that dies is logged with its traceback, restarted, and says so in its status."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from switchyard.backends.vllm import VLLMBackend, VLLMReplica
from switchyard.core.supervision import SupervisedTask
from tests.helpers import async_wait_until


async def _wait_for(predicate) -> None:
    assert await async_wait_until(predicate)  # a generous deadline: it only bounds a hang


async def test_a_task_that_dies_is_logged_loudly_and_restarted(caplog):
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise RuntimeError("bug at http://10.0.0.7:8000")
        await asyncio.sleep(3600)

    task = SupervisedTask("flaky", flaky, min_backoff_s=0.01, max_backoff_s=0.05)
    task.start()
    try:
        await _wait_for(lambda: len(runs) == 3)
        status = task.status()
        assert (status["state"], status["restarts"], status["last_error"]) == ("running", 2, "RuntimeError")
        assert task.is_healthy
        died = [r for r in caplog.records if "background task flaky died" in r.getMessage()]
        assert len(died) == 2 and all(r.levelno == logging.ERROR and r.exc_info for r in died)
        assert "10.0.0.7" not in str(status)  # the exception's words stay in the log
    finally:
        await task.aclose()
    assert task.status()["state"] == "stopped"


async def test_a_crash_looping_task_is_not_healthy_while_it_waits():
    async def broken() -> None:
        raise ValueError("always")

    task = SupervisedTask("broken", broken, min_backoff_s=60)
    task.start()
    try:
        await _wait_for(lambda: task.num_restarts == 1)
        assert task.state == "restarting" and not task.is_healthy
    finally:
        await task.aclose()


async def test_a_task_that_returns_is_finished_not_restarted():
    async def once() -> None:
        return None

    task = SupervisedTask("once", once, min_backoff_s=0.01)
    task.start()
    [supervisor] = [t for t in asyncio.all_tasks() if t.get_name() == "once"]
    await asyncio.wait_for(supervisor, 30)  # the supervisor itself has ended: nothing can restart the run
    assert (task.state, task.num_restarts) == ("finished", 0)
    await task.aclose()


async def test_closing_cancels_the_run():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    task = SupervisedTask("forever", forever)
    task.start()
    await asyncio.wait_for(started.wait(), 30)
    await task.aclose()
    assert cancelled.is_set()


class _ScraperWithABug(VLLMBackend):
    num_scrapes = 0

    async def scrape(self) -> None:
        self.num_scrapes += 1
        if self.num_scrapes == 2:
            raise RuntimeError("a bug in the scraper")


async def test_a_vllm_scraper_that_dies_is_restarted_and_listed():
    async with aiohttp.ClientSession() as session:
        backend = _ScraperWithABug("big", [VLLMReplica("http://127.0.0.1:1/v1")], session, metrics_interval_s=0.01)
        await backend.start()
        try:
            [scraper] = backend.background_tasks()
            await _wait_for(lambda: backend.num_scrapes >= 3)  # the restart comes after a 1 s pause
            assert scraper.name == "vllm-metrics:big"
            assert (scraper.num_restarts, scraper.last_error, scraper.state) == (1, "RuntimeError", "running")
        finally:
            await backend.aclose()
        assert backend.background_tasks() == ()
