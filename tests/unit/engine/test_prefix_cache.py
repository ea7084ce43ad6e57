"""Prefix caching in the embedded engine's batch, on a tiny random model: the same greedy answers
with the cache on and off, hits counted in whole blocks, and the blocks' bookkeeping (freed when
requests end or are cancelled, evicted least recently used first when the cache is full)."""

from __future__ import annotations

import asyncio
import random

import pytest

from switchyard.backends.embedded.sampler import SamplingParams
from tests.helpers import async_wait_until

PAGE = 16
BATCH = dict(single_stream=False, page_size=PAGE)  # the batch's cache, not the single-stream path's
GREEDY = dict(temperature=0.0, top_logprobs=5)
TIMEOUT_S = 600  # bounds a hang only: a 900-token answer beside other work on 2 cores takes minutes


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 290) for _ in range(n)]


async def _run(engine, prompt: list[int], max_tokens: int = 8) -> list:
    steps = engine.generate(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))
    return await asyncio.wait_for(_collect(steps), TIMEOUT_S)


async def _collect(steps) -> list:
    return [step async for step in steps]


def _assert_same_answer(got: list, expected: list) -> None:
    """Token for token, with the same distribution at each step (a wrong block would change it)."""
    assert [s.token_id for s in got] == [s.token_id for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=1e-4)


def _cache(engine):
    return engine._manager.batch_processor.cache


def _allocator(engine):
    (allocator,) = _cache(engine).cache_allocators.values()
    return allocator


def _assert_nothing_held(engine) -> None:
    """Every block is free or kept for reuse (hashed, referenced by no request)."""
    allocator, pool = _allocator(engine), _cache(engine).pool
    ledger = allocator.ledger
    assert not allocator.block_table
    assert not ledger.shared_ref_counts
    assert set(ledger.cached_blocks) == set(ledger.block_to_hash)
    num_free = pool.count_free_blocks(allocator.index) + pool.num_free_sectors * allocator.blocks_per_sector
    assert num_free + len(ledger.cached_blocks) == allocator.num_blocks
    assert engine.num_reserved_blocks == 0


@pytest.fixture
async def on_and_off(make_engine):
    on = await make_engine(num_blocks=64, **BATCH)
    off = await make_engine(num_blocks=64, prefix_caching=False, **BATCH)
    assert on.uses_prefix_caching and not off.uses_prefix_caching
    return on, off


async def test_greedy_answers_are_the_same_with_the_cache_on_and_off(on_and_off):
    on, off = on_and_off
    system = _tokens(0, 70)  # 4 whole blocks and 6 tokens
    prompts = [system + _tokens(seed, 9) for seed in (1, 2, 3)] + [system[:50] + _tokens(4, 30), _tokens(5, 40)]
    num_cached = []
    for prompt in prompts + prompts[:2]:  # the last two: the very same prompts again
        with_cache, without = await _run(on, prompt), await _run(off, prompt)
        _assert_same_answer(with_cache, without)
        num_cached.append(with_cache[0].num_cached_tokens)
        assert without[0].num_cached_tokens == 0
    assert num_cached == [0, 4 * PAGE, 4 * PAGE, 3 * PAGE, 0, 4 * PAGE, 4 * PAGE]


async def test_a_shared_prefix_ending_mid_block_is_reused_in_whole_blocks(on_and_off):
    on, _ = on_and_off
    prefix = _tokens(0, 40)  # 2 whole blocks and 8 tokens
    first = await _run(on, prefix + _tokens(1, 5))
    assert first[0].num_cached_tokens == 0
    second = await _run(on, prefix + _tokens(2, 5))
    assert {s.num_cached_tokens for s in second} == {2 * PAGE}
    # A prompt equal to a cached one up to its last token: that token is still computed.
    again = await _run(on, prefix + _tokens(2, 5))
    assert again[0].num_cached_tokens == (len(prefix) + 5 - 1) // PAGE * PAGE
    _assert_nothing_held(on)


async def test_a_conversation_reuses_its_earlier_turns_answer_included(on_and_off):
    on, off = on_and_off
    turn = _tokens(0, 30)
    answer = [s.token_id for s in await _run(on, turn, max_tokens=20)]
    follow_up = turn + answer + _tokens(1, 7)
    steps = await _run(on, follow_up)
    # The blocks the first answer filled were hashed as it was generated, and match too.
    assert steps[0].num_cached_tokens == (len(turn) + len(answer) - 1) // PAGE * PAGE > len(turn) // PAGE * PAGE
    _assert_same_answer(steps, await _run(off, follow_up))


async def test_a_prefix_is_shared_with_a_request_still_running(make_engine):
    on = await make_engine(num_blocks=128, **BATCH)
    prefix = _tokens(0, 64)
    # Long enough to be running still when the second one's prompt is in (a few steps later): it is
    # read as it comes and left once the second has ended, so only the steps both ran are compared.
    running = on.generate(prefix + _tokens(1, 3), SamplingParams(max_tokens=900, **GREEDY))
    rest = [await asyncio.wait_for(anext(running), TIMEOUT_S)]  # its prompt's blocks are in, and hashed
    joined_done = asyncio.Event()

    async def read_running() -> None:
        async for step in running:
            rest.append(step)
            if joined_done.is_set():
                break
        await running.aclose()

    reader = asyncio.create_task(read_running())
    ledger = _allocator(on).ledger
    joining = on.generate(prefix + _tokens(2, 3), SamplingParams(max_tokens=8, **GREEDY))
    joined = [await asyncio.wait_for(anext(joining), TIMEOUT_S)]
    assert joined[0].num_cached_tokens == 64
    assert len(ledger.shared_ref_counts) == 4  # both requests hold the prefix's 4 blocks
    joined += await asyncio.wait_for(_collect(joining), TIMEOUT_S)
    assert not ledger.shared_ref_counts
    joined_done.set()
    await asyncio.wait_for(reader, TIMEOUT_S)
    assert len(rest) < 900  # it was still running when the second ended
    scheduler = on._manager.batch_processor.scheduler
    assert await async_wait_until(lambda: not scheduler.active_requests and not scheduler.waiting_requests)
    _assert_nothing_held(on)
    # Only now the engine without the cache: two engines running at once on one model would race on
    # the `config.is_causal` that transformers sets for the length of each forward pass.
    off = await make_engine(num_blocks=128, prefix_caching=False, **BATCH)
    _assert_same_answer(joined, await _run(off, prefix + _tokens(2, 3)))
    _assert_same_answer(rest, await _run(off, prefix + _tokens(1, 3), max_tokens=len(rest)))


async def test_cancelled_requests_release_their_blocks(on_and_off):
    on, off = on_and_off
    prefix = _tokens(0, 48)
    # 13 blocks each, 39 of the 64: all three run at once
    streams = [on.generate(prefix + _tokens(i, 4), SamplingParams(max_tokens=150, **GREEDY)) for i in (1, 2, 3)]
    for stream in streams:
        await asyncio.wait_for(anext(stream), TIMEOUT_S)
    assert _allocator(on).ledger.shared_ref_counts
    for stream in streams:
        await stream.aclose()
    scheduler = on._manager.batch_processor.scheduler
    assert await async_wait_until(lambda: not scheduler.active_requests and not scheduler.waiting_requests)
    _assert_nothing_held(on)
    # What the cancelled requests left is whole, hashed blocks: a later request reuses them, rightly.
    prompt = prefix + _tokens(4, 4)
    steps = await _run(on, prompt)
    assert steps[0].num_cached_tokens == 48
    _assert_same_answer(steps, await _run(off, prompt))


async def test_a_full_cache_evicts_its_least_recently_used_prefixes(make_engine):
    on = await make_engine(num_blocks=16, **BATCH)
    off = await make_engine(num_blocks=16, prefix_caching=False, **BATCH)
    # Each runs on 4 blocks and leaves 3 whole ones: 24 in all, for 16. Only as many are evicted as
    # the next request needs, the oldest first: the last 5 prompts' 15 blocks stay.
    prompts = [_tokens(seed, 50) for seed in range(8)]
    for prompt in prompts:
        _assert_same_answer(await _run(on, prompt), await _run(off, prompt))
    _assert_nothing_held(on)
    assert len(_allocator(on).ledger.cached_blocks) == 15
    for prompt in prompts[3:]:
        again = await _run(on, prompt)
        assert again[0].num_cached_tokens == 3 * PAGE
    # A request that needs one block more than is free takes the least recently used prefix's last
    # block: the rest of that prefix still matches.
    await _run(on, _tokens(100, 20))
    assert (await _run(on, prompts[3]))[0].num_cached_tokens == 2 * PAGE
    oldest = await _run(on, prompts[0])
    assert oldest[0].num_cached_tokens == 0
    _assert_same_answer(oldest, await _run(off, prompts[0]))


async def test_under_pressure_every_admitted_request_runs_to_the_right_answer(make_engine):
    on = await make_engine(num_blocks=16, **BATCH)
    off = await make_engine(num_blocks=64, prefix_caching=False, **BATCH)
    shared = _tokens(0, 33)
    prompts = [shared + _tokens(i, 10) for i in range(6)] + [_tokens(i, 40) for i in range(10, 16)]
    # 12 requests of 4 blocks each on 16 blocks: admission queues them; the cache gives way to them.
    together = await asyncio.gather(*(_run(on, p, max_tokens=12) for p in prompts))
    for prompt, steps in zip(prompts, together, strict=True):
        _assert_same_answer(steps, await _run(off, prompt, max_tokens=12))
    _assert_nothing_held(on)


def test_only_models_with_full_attention_in_every_layer_share_blocks():
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig

    from switchyard.backends.embedded.prefix_cache import supports_prefix_caching

    assert supports_prefix_caching(LlamaConfig())
    assert not supports_prefix_caching(Gemma3TextConfig())  # sliding-window layers among full ones
    assert not supports_prefix_caching(MistralConfig(sliding_window=64))
