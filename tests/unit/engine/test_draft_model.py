"""Speculation with a draft model: the rejection scheme keeps the target's distribution, greedy
answers do not change, the drafter's cache follows the context, and a draft model whose vocabulary
differs is refused."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter

import pytest
import torch

from switchyard.backends.embedded.draft_model import DraftModel, DraftModelError, check_draft_model
from switchyard.backends.embedded.sampler import SamplingParams
from switchyard.backends.embedded.speculation import Speculation, verify_sampled
from tests.tiny_model import build_tiny_model

REPEATING = "one two three four five six seven eight nine ten " * 3
OFF = Speculation(method="off")


def _draft(num_tokens: int = 4) -> Speculation:
    return Speculation(method="draft_model", num_tokens=num_tokens, draft_model="(loaded by the test)")


@pytest.fixture(scope="module")
def other_tiny_model(tiny_model):
    """The tiny model with its weights perturbed (seeded): a draft model that sometimes disagrees
    with the target (two tiny random models of other seeds both only repeat the last token)."""
    model, tokenizer = tiny_model
    other = copy.deepcopy(model)
    noise = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for weight in other.parameters():
            weight.add_(torch.randn(weight.shape, generator=noise) * weight.std() * 2)
    return other, tokenizer


async def _run(engine, prompt, **params):
    return [step async for step in engine.generate(prompt, SamplingParams(**params))]


# -- the rejection scheme ---------------------------------------------------------------------------


def test_sampled_drafts_keep_the_target_distribution():
    """Drafts drawn from q, kept with probability min(1, p/q), else replaced from max(0, p - q):
    the first token emitted is distributed as p, whatever q is."""
    p = torch.tensor([0.5, 0.25, 0.15, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # a draft model that favours what the target does not
    logits = p.log().repeat(2, 1)
    params = SamplingParams(temperature=1.0, seed=99)
    draws = torch.Generator().manual_seed(5)
    num_trials = 6000
    first: Counter[int] = Counter()
    num_kept = 0
    for _ in range(num_trials):
        draft = int(torch.multinomial(q, 1, generator=draws))
        choices = verify_sampled(logits, [draft], [q], params, stop_ids=())
        first[choices[0].token_id] += 1
        num_kept += len(choices) == 2
    for token_id, expected in enumerate(p.tolist()):
        assert first[token_id] / num_trials == pytest.approx(expected, abs=0.02)  # deterministic: seeded
    # the acceptance rate is sum(min(p, q)) = 0.1 + 0.2 + 0.15 + 0.1
    assert num_kept / num_trials == pytest.approx(0.55, abs=0.02)


def test_sampled_verify_reports_the_targets_logprobs_and_stops_at_eos():
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(3))
    q = torch.full((6,), 1 / 6)
    params = SamplingParams(temperature=1.0, seed=1, top_logprobs=2)
    lps = torch.log_softmax(logits, -1)
    for _ in range(20):
        choices = verify_sampled(logits, [2, 4], [q, q], params, stop_ids=())
        for position, choice in enumerate(choices):
            assert choice.logprob == pytest.approx(float(lps[position, choice.token_id]))
            assert [t for t, _ in choice.top] == torch.topk(lps[position], 2).indices.tolist()
    # a kept draft that is EOS ends the answer: nothing after it
    certain = torch.full((2, 6), -30.0)
    certain[0, 0] = 30.0
    choices = verify_sampled(certain, [0], [q], params, stop_ids={0})
    assert [c.token_id for c in choices] == [0]


# -- the engine -------------------------------------------------------------------------------------


async def test_greedy_answers_are_the_same_with_a_draft_model(make_engine, tiny_model, other_tiny_model):
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    model, tokenizer = tiny_model
    prompts = [tokenizer.encode(REPEATING), tokenizer.encode("the quick brown fox")]
    plain = await make_engine(speculation=OFF)
    engines = {}
    for name, drafter in (("itself", model), ("another model", other_tiny_model[0])):
        engine = EmbeddedEngine(model, tokenizer, EngineLimits(speculation=_draft()), name=name, draft_model=drafter)
        await asyncio.to_thread(engine.start)
        engines[name] = engine
    try:
        for prompt in prompts:
            expected = await _run(plain, prompt, max_tokens=40, top_logprobs=2, temperature=0.0)
            for name, engine in engines.items():
                steps = await _run(engine, prompt, max_tokens=40, top_logprobs=2, temperature=0.0)
                assert [s.token_id for s in steps] == [s.token_id for s in expected], name
                assert [s.logprob for s in steps] == pytest.approx([s.logprob for s in expected], abs=2e-4), name
        itself, other = engines["itself"].solo_counts, engines["another model"].solo_counts
        assert itself.num_draft_tokens > 0 and itself.num_accepted_tokens == itself.num_draft_tokens
        assert 0 <= other.num_accepted_tokens < other.num_draft_tokens  # drafts rejected, answer unchanged
    finally:
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)


async def test_sampled_answers_with_a_draft_model_are_seeded_and_carry_the_targets_logprobs(
    tiny_model, other_tiny_model
):
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    model, tokenizer = tiny_model
    engine = EmbeddedEngine(
        model, tokenizer, EngineLimits(speculation=_draft(3)), name="drafted", draft_model=other_tiny_model[0]
    )
    await asyncio.to_thread(engine.start)
    try:
        prompt = tokenizer.encode(REPEATING)
        params = dict(max_tokens=30, temperature=0.9, seed=11)
        first = await _run(engine, prompt, **params)
        second = await _run(engine, prompt, **params)
        assert [s.token_id for s in first] == [s.token_id for s in second]  # the seed decides
        # each logprob is the target's own for that token, given what came before
        tokens = [s.token_id for s in first]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        target = torch.log_softmax(logits.float(), -1)
        assert [s.logprob for s in first] == pytest.approx(
            [float(target[i, t]) for i, t in enumerate(tokens)], abs=2e-4
        )
        assert engine.solo_counts.num_draft_tokens > 0
    finally:
        await asyncio.to_thread(engine.stop)


def test_the_drafter_follows_the_context_and_crops_what_the_target_rejected(tiny_model):
    model, tokenizer = tiny_model
    drafter = DraftModel(model, num_tokens=4)
    context = tokenizer.encode("the quick brown fox")
    greedy = SamplingParams(temperature=0.0)
    drafts, probs = drafter.propose(context, 10, greedy)
    assert len(drafts) == 4 and probs is None
    assert drafter._ids == context + drafts[:3]  # the last draft is not read until it is kept
    # the target kept two drafts and chose a token of its own: the third draft's KV goes
    context = context + drafts[:2] + [(drafts[2] + 1) % len(tokenizer)]
    again, _ = drafter.propose(context, 2, greedy)
    assert len(again) == 2
    assert drafter._ids == context + again[:1]
    assert drafter._cache.get_seq_length() == len(drafter._ids)
    # greedy drafts are what a fresh drafter proposes for the same context
    assert DraftModel(model, num_tokens=2).propose(context, 2, greedy)[0] == again


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path, tiny_model):
    from switchyard.backends.embedded.models import load_model

    other_words = ["alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"] * 40
    stranger = load_model(str(build_tiny_model(tmp_path / "stranger", corpus=other_words)))
    with pytest.raises(DraftModelError, match="must share the target's tokenizer"):
        check_draft_model(*stranger, *tiny_model)
    check_draft_model(*tiny_model, *tiny_model)
