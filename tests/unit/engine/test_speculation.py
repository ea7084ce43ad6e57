"""The single-stream path and prompt-lookup speculation: exactness with the feature on and off, the
rejection scheme's distribution, and the bookkeeping (drafts, blocks, cancellation, hand-over)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
import torch

from switchyard.backends.embedded.sampler import SamplingParams, choose_tokens
from switchyard.backends.embedded.speculation import PromptLookup, Speculation, verify
from tests.helpers import async_wait_until

GREEDY = dict(temperature=0.0)
OFF = Speculation(method="off")
# A prompt that repeats itself, so that the tiny model's answer has something to copy.
REPEATING = "one two three four five six seven eight nine ten " * 3


async def _run(engine, prompt, **params):
    return [step async for step in engine.generate(prompt, SamplingParams(**params))]


# -- prompt lookup ----------------------------------------------------------------------------------


def test_lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_suffix():
    lookup = PromptLookup([1, 2, 3, 9, 5, 2, 3, 4, 7, 8, 1, 2, 3], Speculation(num_tokens=3, max_ngram=3))
    # "1 2 3" occurred once before, followed by 9 5 2; "2 3" occurred later, followed by 4 7 8.
    assert lookup.propose(10) == [9, 5, 2]
    assert lookup.propose(2) == [9, 5]
    lookup.extend([6])
    assert lookup.propose(10) == []  # 6 never occurred before
    lookup.extend([1, 2])
    assert lookup.propose(10) == [3, 6, 1]  # "6 1 2" is new; "1 2" last led to 3 (the occurrence before this one)


def test_lookup_respects_min_ngram_and_draft_count():
    lookup = PromptLookup([5, 6, 7, 5], Speculation(num_tokens=2, max_ngram=2, min_ngram=2))
    assert lookup.propose(10) == []  # only a 1-gram recurs
    lookup = PromptLookup([5, 6, 7, 5], Speculation(num_tokens=2, max_ngram=2, min_ngram=1))
    assert lookup.propose(10) == [6, 7]
    assert lookup.propose(0) == []


# -- verification -----------------------------------------------------------------------------------


def _logits_favouring(*token_ids: int, vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(token_ids), vocab)
    for row, token_id in enumerate(token_ids):
        logits[row, token_id] = 5.0
    return logits


def test_greedy_verify_keeps_matching_drafts_then_the_models_own_choice():
    logits = _logits_favouring(3, 4, 6, 1)  # the model's argmax after each of [last, 3, 4, 5]
    choices = verify(logits, [3, 4, 5], SamplingParams(temperature=0.0), stop_ids={0})
    assert [c.token_id for c in choices] == [3, 4, 6]  # 5 rejected; 6 is the correction
    lps = torch.log_softmax(logits, -1)
    assert [c.logprob for c in choices] == pytest.approx([float(lps[0, 3]), float(lps[1, 4]), float(lps[2, 6])])


def test_greedy_verify_adds_a_bonus_token_when_every_draft_is_kept_and_stops_at_eos():
    choices = verify(_logits_favouring(3, 4, 2), [3, 4], SamplingParams(temperature=0.0), stop_ids={0})
    assert [c.token_id for c in choices] == [3, 4, 2]
    choices = verify(_logits_favouring(0, 4, 2), [0, 4], SamplingParams(temperature=0.0), stop_ids={0})
    assert [c.token_id for c in choices] == [0]


def test_sampled_verify_draws_as_decoding_without_drafts_does():
    """With one generator, the first token verify emits is the one plain sampling draws: the scheme
    is the target's own draw compared with the draft, so the seeded answer does not change."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    for seed in range(50):
        plain = choose_tokens(logits[:1], [SamplingParams(temperature=0.8, top_p=0.9, seed=seed)])[0]
        draft = [plain.token_id, 7, 8] if seed % 2 else [(plain.token_id + 1) % 50, 7, 8]
        speculative = verify(logits, draft, SamplingParams(temperature=0.8, top_p=0.9, seed=seed), stop_ids=())
        assert speculative[0].token_id == plain.token_id
        assert speculative[0].logprob == pytest.approx(plain.logprob)


def test_rejection_scheme_keeps_the_target_distribution():
    """A draft is kept with probability p(draft); the tokens emitted first are distributed as p."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(2, 1)
    params = SamplingParams(temperature=1.0, seed=1234)
    num_trials = 4000
    first = Counter(verify(logits, [1], params, stop_ids=())[0].token_id for _ in range(num_trials))
    for token_id, p in enumerate(probs.tolist()):
        assert first[token_id] / num_trials == pytest.approx(p, abs=0.03)  # deterministic: seeded


# -- the engine -------------------------------------------------------------------------------------


async def test_greedy_answers_are_the_same_with_speculation_on_off_and_in_the_batch(make_engine, tiny_model):
    _, tokenizer = tiny_model
    prompts = [tokenizer.encode(REPEATING), tokenizer.encode("the quick brown fox")]
    batch = await make_engine(single_stream=False)
    solo = await make_engine(speculation=OFF)
    speculative = await make_engine(speculation=Speculation(num_tokens=4, max_ngram=3))
    for prompt in prompts:
        expected = await _run(batch, prompt, max_tokens=40, top_logprobs=3, **GREEDY)
        for engine in (solo, speculative):
            steps = await _run(engine, prompt, max_tokens=40, top_logprobs=3, **GREEDY)
            assert [s.token_id for s in steps] == [s.token_id for s in expected]
            assert [s.logprob for s in steps] == pytest.approx([s.logprob for s in expected], abs=2e-4)
            assert [[t for t, _ in s.top] for s in steps] == [[t for t, _ in s.top] for s in expected]
    counts = speculative.solo_counts
    assert counts.num_requests == 2
    assert counts.num_draft_tokens > 0
    assert 0 < counts.num_accepted_tokens <= counts.num_draft_tokens
    assert solo.solo_counts.num_draft_tokens == 0
    assert batch.solo_counts is None


async def test_seeded_sampling_is_the_same_with_speculation_on_and_off(make_engine, tiny_model):
    _, tokenizer = tiny_model
    prompt = tokenizer.encode(REPEATING)
    solo = await make_engine(speculation=OFF)
    speculative = await make_engine()
    for seed in (1, 2, 3):
        params = dict(max_tokens=30, temperature=0.7, seed=seed)
        expected = [s.token_id for s in await _run(solo, prompt, **params)]
        assert [s.token_id for s in await _run(speculative, prompt, **params)] == expected


async def test_the_answer_stops_at_max_tokens_and_eos_with_drafts_pending(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(speculation=Speculation(num_tokens=8, max_ngram=2))
    reference = await make_engine(single_stream=False)
    prompt = tokenizer.encode(REPEATING)
    for max_tokens in (1, 2, 7, 23):
        steps = await _run(engine, prompt, max_tokens=max_tokens, **GREEDY)
        assert [s.token_id for s in steps] == [
            s.token_id for s in await _run(reference, prompt, max_tokens=max_tokens, **GREEDY)
        ]
        assert len(steps) <= max_tokens
    assert engine.num_reserved_blocks == 0


async def test_cancelling_a_lone_request_frees_its_blocks_and_the_path(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(num_blocks=64, page_size=16)
    stream = engine.generate(tokenizer.encode(REPEATING), SamplingParams(max_tokens=400, **GREEDY))
    got = [await anext(stream) for _ in range(3)]
    assert engine._solo_run is not None and engine.num_reserved_blocks > 0
    await stream.aclose()
    assert len(got) == 3
    assert engine.num_reserved_blocks == 0 and engine._solo_run is None
    # The next lone request runs on the path once the cancelled one has left its thread.
    assert len(await _run(engine, tokenizer.encode("one two"), max_tokens=4, **GREEDY)) == 4
    assert engine.solo_counts.num_requests == 2


async def test_a_lone_request_hands_over_to_the_batch_when_another_arrives(make_engine, tiny_model):
    _, tokenizer = tiny_model
    first, second = tokenizer.encode(REPEATING), tokenizer.encode("paris is the capital")
    reference = await make_engine(single_stream=False)
    expected_first = [s.token_id for s in await _run(reference, first, max_tokens=60, **GREEDY)]
    expected_second = [s.token_id for s in await _run(reference, second, max_tokens=20, **GREEDY)]

    engine = await make_engine(num_blocks=64, page_size=16)
    # The lone request's second forward pass waits until the second request is in the batch, so
    # that it hands over at its third step however fast the model is.
    second_is_in = threading.Event()
    forward, num_calls = engine._solo._forward, []

    def gated_forward(*args, **kwargs):
        num_calls.append(1)
        if len(num_calls) == 2:
            assert second_is_in.wait(timeout=60)
        return forward(*args, **kwargs)

    engine._solo._forward = gated_forward
    stream = engine.generate(first, SamplingParams(max_tokens=60, **GREEDY))
    got = [await anext(stream)]
    assert engine._solo_run is not None
    other = asyncio.create_task(_run(engine, second, max_tokens=20, **GREEDY))
    assert await async_wait_until(lambda: engine._params)  # the second is in the batch
    second_is_in.set()
    got += [step async for step in stream]
    assert [s.token_id for s in got] == expected_first
    assert [s.token_id for s in await other] == expected_second
    assert engine.solo_counts.num_handovers == 1
    assert engine.num_reserved_blocks == 0


async def test_a_lone_request_reuses_the_previous_requests_prefix(make_engine, tiny_model):
    _, tokenizer = tiny_model
    system = tokenizer.encode(REPEATING)
    engine = await make_engine()
    reference = await make_engine(single_stream=False)
    await _run(engine, system + tokenizer.encode("one two"), max_tokens=5, **GREEDY)
    prompt = system + tokenizer.encode("paris is")
    steps = await _run(engine, prompt, max_tokens=10, **GREEDY)
    assert steps[0].num_cached_tokens >= len(system)
    assert [s.token_id for s in steps] == [s.token_id for s in await _run(reference, prompt, max_tokens=10, **GREEDY)]


async def test_without_prefix_caching_nothing_is_reused(make_engine, tiny_model):
    _, tokenizer = tiny_model
    engine = await make_engine(prefix_caching=False)
    prompt = tokenizer.encode(REPEATING)
    await _run(engine, prompt, max_tokens=3, **GREEDY)
    steps = await _run(engine, prompt, max_tokens=3, **GREEDY)
    assert steps[0].num_cached_tokens == 0
    assert engine.solo_counts.num_reused_tokens == 0
