"""Throughput and inter-token latency of the embedded engine, against plain `model.generate`.

In one run, on one loaded model: plain `generate` one request at a time (greedy, logprobs via
output_scores), then the engine at concurrency 1, 8 and 32 (greedy, logprobs + top_logprobs=5).
Prints aggregate tokens/s, p50 inter-token latency, the speed-up over plain generate, and peak
RSS; writes the engine section of bench/RESULTS.md.

    .venv/bin/python bench/engine.py                       # SmolLM2-135M, 32 new tokens each
    .venv/bin/python bench/engine.py --concurrency 1 8 --new-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from results import write_section  # noqa: E402 - bench/ is on sys.path when run as a script

TOPICS = ["a robot", "the sea", "a lighthouse", "winter", "a train", "the moon", "a garden", "a city at night"]


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} (#{i})."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for i in range(n)
    ]


def plain_generate(model, tokenizer, n: int, new_tokens: int) -> tuple[float, float]:
    """tokens/s and p50 inter-token latency (ms) of `generate`, one request at a time."""
    import torch

    num_tokens, gaps = 0, []
    started = time.perf_counter()
    for ids in prompts(tokenizer, n):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.eos_token_id,
            )
        generated = out.sequences.shape[1] - len(ids)
        num_tokens += generated
        gaps.append((time.perf_counter() - t0) / generated * 1000)
    return num_tokens / (time.perf_counter() - started), statistics.median(gaps)


async def engine_run(engine, tokenizer, concurrency: int, new_tokens: int) -> tuple[float, float]:
    from switchyard.backends.embedded.sampler import SamplingParams

    gaps: list[float] = []

    async def one(ids: list[int]) -> int:
        last, count = time.perf_counter(), 0
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, top_logprobs=5)
        async for _ in engine.generate(ids, params):
            now = time.perf_counter()
            if count:
                gaps.append((now - last) * 1000)
            last, count = now, count + 1
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(ids) for ids in prompts(tokenizer, concurrency)))
    return sum(counts) / (time.perf_counter() - started), statistics.median(gaps)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--baseline-requests", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits
    from switchyard.backends.embedded.models import load_model

    model, tokenizer = load_model(args.model)
    print(f"plain generate, {args.baseline_requests} requests one at a time …", file=sys.stderr)
    base_tps, base_itl = plain_generate(model, tokenizer, args.baseline_requests, args.new_tokens)
    engine = EmbeddedEngine(model, tokenizer, EngineLimits(num_blocks=512, page_size=32, max_batch_tokens=512))
    await asyncio.to_thread(engine.start)
    rows = [("plain generate", 1, base_tps, base_itl)]
    try:
        await engine_run(engine, tokenizer, 1, 4)  # warm-up
        for c in args.concurrency:
            print(f"engine, concurrency {c} …", file=sys.stderr)
            tps, itl = await engine_run(engine, tokenizer, c, args.new_tokens)
            rows.append(("engine", c, tps, itl))
    finally:
        await asyncio.to_thread(engine.stop)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    single = next(tps for name, c, tps, _ in rows if name == "engine" and c == 1) if 1 in args.concurrency else None
    lines = [
        f"## Embedded engine (`bench/engine.py`)\n\nRun {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
        f"{os.cpu_count()} cores; model {args.model}, float32, {args.new_tokens} new tokens per request, greedy, "
        f"logprobs on (engine: top_logprobs=5); peak RSS {peak_rss_mb:.0f} MB.\n",
        "| path | concurrency | tokens/s | p50 inter-token ms | × plain generate | × engine at 1 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, c, tps, itl in rows:
        vs_single = f"{tps / single:.1f}×" if single and name == "engine" else "-"
        lines.append(f"| {name} | {c} | {tps:.1f} | {itl:.1f} | {tps / base_tps:.1f}× | {vs_single} |")
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_section("engine", section)


if __name__ == "__main__":
    asyncio.run(main())
