"""The embedded engine on a tiny random model: exactness, concurrency, cancellation, admission."""

from __future__ import annotations

import asyncio

import pytest
import torch

from switchyard.backends.embedded.sampler import SamplingParams
from switchyard.core.errors import BackendUnavailable, ContextLengthExceeded
from tests.helpers import async_wait_until

GREEDY = dict(temperature=0.0)


def _prompt(tokenizer, text="the quick brown fox") -> list[int]:
    return tokenizer.encode(text)


async def _run(engine, prompt, **params):
    return [step async for step in engine.generate(prompt, SamplingParams(**params))]


async def test_greedy_tokens_and_logprobs_match_plain_generate(make_engine, tiny_model):
    model, tokenizer = tiny_model
    engine = await make_engine()
    prompt = _prompt(tokenizer)
    steps = await _run(engine, prompt, max_tokens=12, top_logprobs=5, **GREEDY)
    with torch.no_grad():
        reference = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    ref_tokens = reference.sequences[0, len(prompt) :].tolist()
    assert [s.token_id for s in steps] == ref_tokens[: len(steps)]
    for step, scores in zip(steps, reference.scores, strict=False):
        expected = torch.log_softmax(scores[0].float(), -1)
        assert abs(step.logprob - float(expected[step.token_id])) < 2e-4
        assert step.logprob <= 0
        assert [lp for _, lp in step.top] == sorted((lp for _, lp in step.top), reverse=True)
        assert step.top[0][0] == step.token_id


async def test_concurrent_requests_each_get_their_own_answer(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine()
    prompts = [_prompt(tokenizer, t) for t in ("one two", "paris is", "a stitch in time", "the lazy dog")] * 2
    alone = [await _run(engine, p, max_tokens=10, **GREEDY) for p in prompts[:4]]
    together = await asyncio.gather(*(_run(engine, p, max_tokens=10, **GREEDY) for p in prompts))
    for i, steps in enumerate(together):
        assert [s.token_id for s in steps] == [s.token_id for s in alone[i % 4]]


async def test_cancelling_mid_stream_leaves_the_batch_and_frees_blocks(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(num_blocks=64, page_size=16)
    stream = engine.generate(_prompt(tokenizer), SamplingParams(max_tokens=400, **GREEDY))
    got = [await anext(stream) for _ in range(3)]
    assert engine.num_reserved_blocks > 0
    await stream.aclose()
    assert len(got) == 3
    assert engine.num_reserved_blocks == 0
    scheduler = engine._manager.batch_processor.scheduler
    assert await async_wait_until(lambda: not scheduler.active_requests and not scheduler.waiting_requests)
    # The engine goes on serving.
    assert len(await _run(engine, _prompt(tokenizer), max_tokens=4, **GREEDY)) == 4


async def test_prompt_over_the_context_window_is_context_length_exceeded(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(context_window=32)
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 32 tokens"):
        await _run(engine, list(range(5, 35)), max_tokens=8)


async def test_a_request_larger_than_the_whole_cache_is_refused_not_queued(make_engine, tiny_model):
    engine = await make_engine(num_blocks=4, page_size=16, context_window=1024)
    with pytest.raises(ContextLengthExceeded, match="KV cache"):
        await _run(engine, list(range(5, 45)), max_tokens=40)


async def test_when_blocks_are_taken_requests_queue_then_run(make_engine, tiny_model):
    _, tokenizer = tiny_model
    # queue_timeout_s: the second waits as long as the test holds the first, however slow the machine
    engine = await make_engine(num_blocks=8, page_size=16, max_queue=4, queue_timeout_s=600)
    prompt = _prompt(tokenizer)  # a few tokens + 100 new: 7 of the 8 blocks each
    # An open stream keeps its blocks until it is exhausted or closed: the first holds them while the
    # test holds it, however fast the model generates the rest.
    first = engine.generate(prompt, SamplingParams(max_tokens=100, **GREEDY))
    a = [await anext(first)]
    second = asyncio.create_task(_run(engine, prompt, max_tokens=100, **GREEDY))
    assert await async_wait_until(lambda: engine.num_waiting == 1)
    assert engine.num_waiting_tokens == len(prompt) + 100  # what /metrics shows as its queue depth
    assert not second.done()
    a += [step async for step in first]
    b = await second
    assert [s.token_id for s in a] == [s.token_id for s in b]
    assert engine.num_reserved_blocks == 0
    assert engine.num_waiting_tokens == 0


async def test_a_full_queue_is_refused_with_retry_after(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(num_blocks=8, page_size=16, max_queue=0)
    prompt = _prompt(tokenizer)
    first = engine.generate(prompt, SamplingParams(max_tokens=100, **GREEDY))
    await anext(first)  # open, it holds 7 of the 8 blocks however fast the model is
    with pytest.raises(BackendUnavailable) as info:
        await _run(engine, prompt, max_tokens=100, **GREEDY)
    assert info.value.status_code == 503
    assert info.value.retry_after_s == 1
    async for _ in first:  # the first runs on to its end
        pass
    assert engine.num_reserved_blocks == 0
