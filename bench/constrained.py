"""What JSON-constrained decoding costs on the embedded engine: tokens/s with and without a grammar.

One loaded model, greedy, the same prompts: free text, response_format json_object, and a nested
json_schema, each at concurrency 1 and 8. The grammar's share is the time spent asking it for the
allowed tokens (on the batching thread, per token per request). Writes the constrained section of
bench/RESULTS.md.

    .venv/bin/python bench/constrained.py                  # SmolLM2-135M, up to 64 new tokens
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import write_section  # noqa: E402 - bench/ is on sys.path when run as a script

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "coordinates": {
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        },
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city", "population", "coordinates", "landmarks"],
}
CITIES = ["Paris", "Rome", "Madrid", "Berlin", "Lisbon", "Vienna", "Prague", "Oslo"]
MODES = {"free text": ("none", None), "json_object": ("json", None), "json_schema (nested)": ("json", CITY)}


class TimedConstraint:
    """A constraint that adds the time spent in the grammar to a shared counter."""

    def __init__(self, inner, spent: list[float]) -> None:
        self._inner, self._spent = inner, spent

    def allowed_token_ids(self):
        started = time.perf_counter()
        try:
            return self._inner.allowed_token_ids()
        finally:
            self._spent[0] += time.perf_counter() - started

    def advance(self, token_id: int) -> None:
        started = time.perf_counter()
        self._inner.advance(token_id)
        self._spent[0] += time.perf_counter() - started


async def run(engine, grammar, tokenizer, mode, concurrency: int, new_tokens: int) -> tuple[float, float, int]:
    from switchyard.backends.embedded.sampler import SamplingParams

    kind, schema = MODES[mode]
    spent = [0.0]

    async def one(i: int) -> int:
        text = f"Describe {CITIES[i % len(CITIES)]} as JSON."
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        constraint = TimedConstraint(grammar.constraint(schema), spent) if kind == "json" else None
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, constraint=constraint)
        return len([step async for step in engine.generate(list(ids), params)])

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    return sum(counts) / elapsed, 1000 * spent[0] / max(1, sum(counts)), sum(counts)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    from switchyard.backends.embedded.constraints import JsonGrammar
    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits
    from switchyard.backends.embedded.models import load_model

    model, tokenizer = load_model(args.model, num_threads=2)
    engine = EmbeddedEngine(model, tokenizer, EngineLimits(num_blocks=128, page_size=32, context_window=1024))
    await asyncio.to_thread(engine.start)
    grammar = JsonGrammar(tokenizer)
    started = time.perf_counter()
    await asyncio.to_thread(grammar.prepare)
    prepare_s = time.perf_counter() - started
    try:
        await run(engine, grammar, tokenizer, "json_object", 1, 8)  # warm-up
        rows = []
        for concurrency in args.concurrency:
            for mode in MODES:
                tps, grammar_ms, tokens = await run(engine, grammar, tokenizer, mode, concurrency, args.new_tokens)
                rows.append((mode, concurrency, tps, grammar_ms, tokens))
                print(f"{mode:22} c={concurrency:<3} {tps:6.1f} tok/s  grammar {grammar_ms:5.2f} ms/token  ({tokens})")
    finally:
        await asyncio.to_thread(engine.stop)
    lines = [
        "## JSON-constrained decoding on the embedded engine (`bench/constrained.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, 2 cores (shared with other work: compare rows "
        f"of this run, not runs); model {args.model}, greedy, up to {args.new_tokens} new tokens per request. "
        f"Building the grammar's view of the vocabulary (once per engine, on the first JSON request): "
        f"{prepare_s:.1f} s.",
        "",
        "| mode | concurrency | tokens/s | grammar ms per token | grammar share of the time | tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {m} | {c} | {t:.1f} | {g:.2f} | {g * t / 1000:.1%} | {n} |" for m, c, t, g, n in rows),
        "",
        "Compare rows with as many tokens: json_object answers are short here (the model closes the "
        "object early), so their tokens/s carries the prompt's prefill; json_schema answers run to the "
        "limit as free text does. The grammar's share is the time spent asking it for allowed tokens.",
    ]
    write_section("constrained", "\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
