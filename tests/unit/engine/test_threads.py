from __future__ import annotations

import asyncio
import concurrent.futures

import torch

from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits
from switchyard.backends.embedded.threads import WAIT_POLICY, choose_wait_policy


def test_the_wait_policy_is_set_when_the_environment_has_none():
    environ: dict[str, str] = {}
    assert choose_wait_policy(environ) == WAIT_POLICY
    assert environ == {"OMP_WAIT_POLICY": WAIT_POLICY}


def test_the_environment_s_wait_policy_wins():
    environ = {"OMP_WAIT_POLICY": "active"}
    assert choose_wait_policy(environ) == "active"
    assert environ == {"OMP_WAIT_POLICY": "active"}


async def test_an_engine_thread_uses_its_own_thread_count_whatever_was_set_last(tiny_model):
    model, tokenizer = tiny_model
    before = torch.get_num_threads()
    engine = EmbeddedEngine(model, tokenizer, EngineLimits(), name="tiny", num_threads=1)
    await asyncio.to_thread(engine.start)
    try:
        torch.set_num_threads(2)  # another model loading meanwhile, in another thread
        seen: concurrent.futures.Future[int] = concurrent.futures.Future()
        assert engine._manager is not None
        engine._manager.run_soon(lambda: seen.set_result(torch.get_num_threads()))
        assert await asyncio.wait_for(asyncio.wrap_future(seen), 30) == 1
    finally:
        await asyncio.to_thread(engine.stop)
        torch.set_num_threads(before)
