"""The embedded engine against plain `model.generate`, in one process and one run, on one loaded model.

Plain `generate` one request at a time (greedy, logprobs via output_scores) on each workload, then
the engine (greedy, logprobs + top_logprobs=5):

- free writing (short stories) at concurrency 1, 8 and 32: the batch path (`single_stream: false`),
  the single-stream path, the single-stream path with prompt-lookup speculation (the default), and
  with a draft model (the model's own first `--draft-layers` layers);
- copy-heavy answers (repeat a paragraph, rename a function in code) at concurrency 1, the same
  three ways;
- a shared 1,500-token system prompt: 16 requests one after another, time to first token of the
  first and of the later ones, with prefix caching on and off, on the batch path and on the
  single-stream path.

Prints the table and writes the engine section of bench/RESULTS.md.

    .venv/bin/python bench/engine.py                       # SmolLM2-135M
    .venv/bin/python bench/engine.py --concurrency 1 8 --new-tokens 16 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
DOC = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed La dame "
    "de fer, it was constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial anniversary "
    "of the French Revolution."
)
CODE = (
    "def parse_line(line):\n    parts = line.strip().split(',')\n    name = parts[0]\n    age = int(parts[1])\n"
    "    city = parts[2]\n    return {'name': name, 'age': age, 'city': city}\n\n\ndef parse_file(path):\n"
    "    rows = []\n    with open(path) as f:\n        for line in f:\n            rows.append(parse_line(line))\n"
    "    return rows\n"
)
COPY_TASKS = [
    f"Repeat the following text exactly, word for word:\n\n{DOC}",
    "Rename the function parse_line to parse_row everywhere in this code and print the full updated code:\n\n"
    f"```python\n{CODE}```",
]
SYSTEM_SENTENCE = "You are the support assistant of Switchyard, a proxy that routes requests to language models. "


def _chat(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def prompts(tokenizer, n: int) -> list[list[int]]:
    """Free writing."""
    topics = [TOPICS[i % len(TOPICS)] for i in range(n)]
    return [
        _chat(tokenizer, [{"role": "user", "content": f"Write a short story about {t} (#{i})."}])
        for i, t in enumerate(topics)
    ]


def copy_prompts(tokenizer, n: int) -> list[list[int]]:
    return [_chat(tokenizer, [{"role": "user", "content": COPY_TASKS[i % len(COPY_TASKS)]}]) for i in range(n)]


def shared_prefix_prompts(tokenizer, n: int, num_prefix_tokens: int) -> list[list[int]]:
    system = SYSTEM_SENTENCE
    while len(tokenizer.encode(system)) < num_prefix_tokens:
        system += SYSTEM_SENTENCE
    return [
        _chat(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: {t}?"}])
        for i, t in enumerate((TOPICS * n)[:n])
    ]


class _Clock:
    """A `generate` streamer that notes when each new token comes (its first call is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def plain_generate(model, tokenizer, prompt_ids: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """tokens/s and the p50 over requests of ms per token after the first, `generate` one request at a time."""
    import torch

    num_tokens, per_token_ms = 0, []
    started = time.perf_counter()
    for ids in prompt_ids:
        clock = _Clock()
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=tokenizer.eos_token_id,
                streamer=clock,
            )
        num_tokens += out.sequences.shape[1] - len(ids)
        times = clock.times[1:]
        per_token_ms.append((times[-1] - times[0]) / max(1, len(times) - 1) * 1000)
    return num_tokens / (time.perf_counter() - started), statistics.median(per_token_ms)


async def engine_run(engine, prompt_ids: list[list[int]], concurrency: int, new_tokens: int) -> tuple[float, float]:
    """tokens/s and the p50 over requests of ms per token after the first, `concurrency` requests at a time.
    (Per request, not per gap: speculation delivers several tokens at once.)"""
    from switchyard.backends.embedded.sampler import SamplingParams

    per_token_ms: list[float] = []
    queue = list(prompt_ids)

    async def worker() -> int:
        count = 0
        while queue:
            ids = queue.pop(0)
            params = SamplingParams(max_tokens=new_tokens, temperature=0.0, top_logprobs=5)
            times = [time.perf_counter() async for _ in engine.generate(ids, params)]
            if len(times) > 1:
                per_token_ms.append((times[-1] - times[0]) / (len(times) - 1) * 1000)
            count += len(times)
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sum(counts) / (time.perf_counter() - started), statistics.median(per_token_ms or [0.0])


async def ttft_run(engine, prompt_ids: list[list[int]]) -> tuple[float, float]:
    """Time to first token (ms) of the first request, and the median of the later ones, one at a time."""
    from switchyard.backends.embedded.sampler import SamplingParams

    ttfts = []
    for ids in prompt_ids:
        t0 = time.perf_counter()
        stream = engine.generate(ids, SamplingParams(max_tokens=4, temperature=0.0))
        await anext(stream)
        ttfts.append((time.perf_counter() - t0) * 1000)
        async for _ in stream:
            pass
    return ttfts[0], statistics.median(ttfts[1:])


class Engines:
    """Engines on the one loaded model, each started for its rows and stopped after them."""

    def __init__(self, model, tokenizer, draft_model=None, **base) -> None:
        from switchyard.backends.embedded.engine import EngineLimits

        self.model, self.tokenizer, self.base = model, tokenizer, base
        self.draft_model = draft_model
        self.has_prefix_caching = "prefix_caching" in {f.name for f in dataclasses.fields(EngineLimits)}

    async def __call__(self, **limits):
        from switchyard.backends.embedded.engine import EmbeddedEngine, EngineLimits

        extra = {"draft_model": self.draft_model} if limits.get("speculation_draft") else {}
        limits = {k: v for k, v in limits.items() if k != "speculation_draft"}
        engine = EmbeddedEngine(self.model, self.tokenizer, EngineLimits(**{**self.base, **limits}), **extra)
        await asyncio.to_thread(engine.start)
        return engine


def shallow_copy_of(model, num_layers: int):
    """The model's first `num_layers` decoder layers and its head: a draft model that needs no
    second download (the only one a single local model allows), untrained for the task."""
    import copy

    shallow = copy.deepcopy(model)
    shallow.model.layers = shallow.model.layers[:num_layers]
    shallow.config.num_hidden_layers = num_layers
    return shallow


PATHS = {
    "batch path": dict(single_stream=False),
    "single stream": dict(speculation_method="off"),
    "single stream + prompt lookup": {},
    "single stream + draft model": dict(speculation_method="draft_model"),
}


def _limits(path: dict, num_draft_tokens: int = 4) -> dict:
    from switchyard.backends.embedded.speculation import Speculation

    limits = dict(path)
    method = limits.pop("speculation_method", None)
    if method == "off":
        limits["speculation"] = Speculation(method="off")
    elif method == "draft_model":
        limits["speculation"] = Speculation(method="draft_model", num_tokens=num_draft_tokens, draft_model="shallow")
        limits["speculation_draft"] = True
    return limits


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--baseline-requests", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--prefix-requests", type=int, default=16)
    parser.add_argument(
        "--draft-layers", type=int, default=15, help="the draft model: the model's first N layers (0: no draft rows)"
    )
    parser.add_argument("--draft-tokens", type=int, default=4, help="drafts per step for the draft model")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from switchyard.backends.embedded.models import load_model

    model, tokenizer = load_model(args.model)
    n = args.baseline_requests
    workloads = {"free writing": prompts(tokenizer, max(32, n)), "copy-heavy": copy_prompts(tokenizer, max(32, n))}
    base: dict[str, tuple[float, float]] = {}
    for workload, ids in workloads.items():
        print(f"plain generate, {workload}, {n} requests one at a time …", file=sys.stderr)
        base[workload] = plain_generate(model, tokenizer, ids[:n], args.new_tokens)
    draft_model = shallow_copy_of(model, args.draft_layers) if args.draft_layers else None
    engines = Engines(
        model, tokenizer, draft_model, num_blocks=512, page_size=32, max_batch_tokens=512, context_window=2048
    )
    rows: list[tuple[str, str, int, float, float]] = [
        ("plain generate", workload, 1, tps, itl) for workload, (tps, itl) in base.items()
    ]
    acceptance: dict[str, str] = {}
    for path, limits in PATHS.items():
        if limits.get("speculation_method") == "draft_model" and draft_model is None:
            continue
        engine = await engines(**_limits(limits, args.draft_tokens))
        try:
            await engine_run(engine, workloads["free writing"][:1], 1, 4)  # warm-up
            for workload, ids in workloads.items():
                for c in args.concurrency if workload == "free writing" else [1]:
                    if c > 1 and path != "single stream + prompt lookup" and path != "batch path":
                        continue  # beyond one stream the single-stream path hands over: the batch rows say it
                    print(f"engine, {path}, {workload}, concurrency {c} …", file=sys.stderr)
                    before = dataclasses.replace(engine.solo_counts) if engine.solo_counts is not None else None
                    tps, itl = await engine_run(engine, ids[: max(c, n)], c, args.new_tokens)
                    rows.append((f"engine, {path}", workload, c, tps, itl))
                    counts = engine.solo_counts
                    if before is not None and counts is not None and counts.num_draft_tokens > before.num_draft_tokens:
                        num_drafts = counts.num_draft_tokens - before.num_draft_tokens
                        num_kept = counts.num_accepted_tokens - before.num_accepted_tokens
                        acceptance[f"{path}, {workload}, concurrency {c}"] = (
                            f"{num_kept}/{num_drafts} ({num_kept / num_drafts:.0%})"
                        )
                        print(
                            f"{path}, {workload}: {acceptance[f'{path}, {workload}, concurrency {c}']} drafts kept",
                            file=sys.stderr,
                        )
        finally:
            await asyncio.to_thread(engine.stop)

    prefix_rows = []
    prefixed = shared_prefix_prompts(tokenizer, args.prefix_requests, args.prefix_tokens)
    num_shared = next(i for i, (a, b) in enumerate(zip(prefixed[0], prefixed[1], strict=False)) if a != b)
    for path in ("batch path", "single stream"):
        for caching in (False, True):
            if not engines.has_prefix_caching and path == "batch path" and caching:
                print("EngineLimits has no prefix_caching yet: batch-path caching row skipped", file=sys.stderr)
                continue
            limits = _limits(PATHS[path]) | ({"prefix_caching": caching} if engines.has_prefix_caching else {})
            print(f"shared prefix, {path}, prefix caching {caching} …", file=sys.stderr)
            engine = await engines(**limits)
            try:
                first, later = await ttft_run(engine, prefixed)
            finally:
                await asyncio.to_thread(engine.stop)
            prefix_rows.append((path, caching, first, later))

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        f"## Embedded engine (`bench/engine.py`)\n\nRun {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()}, "
        f"{os.cpu_count()} cores; model {args.model}, float32, up to {args.new_tokens} new tokens per request, greedy, "
        f"logprobs on (engine: top_logprobs=5); at least {n} requests per row; peak RSS {peak_rss_mb:.0f} MB. "
        "× plain generate: against plain `generate` one request at a time on the same workload.\n",
        "| path | workload | concurrency | tokens/s | p50 ms per token | × plain generate |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, workload, c, tps, itl in rows:
        lines.append(f"| {name} | {workload} | {c} | {tps:.1f} | {itl:.1f} | {tps / base[workload][0]:.2f}× |")
    if acceptance:
        lines += ["", "Drafts kept by the model (speculation's acceptance rate), per row:", ""]
        lines += [f"- {row}: {rate}" for row, rate in acceptance.items()]
    if draft_model is not None:
        lines += [
            "",
            f"The draft model is the model's own first {args.draft_layers} of {model.config.num_hidden_layers} "
            f"layers with its head ({args.draft_tokens} drafts a step): the only draft a single local model allows, "
            "untrained for the task.",
        ]
    lines += [
        "",
        f"Shared system prompt: {args.prefix_requests} requests one after another, each a "
        f"{len(prefixed[0])}-token prompt whose first {num_shared} tokens are the same for all; "
        "time to first token of the first request and the median of the later ones.",
        "",
        "| path | prefix caching | first TTFT ms | later TTFT ms (p50) | later ÷ first |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for path, caching, first, later in prefix_rows:
        lines.append(f"| {path} | {'on' if caching else 'off'} | {first:.0f} | {later:.0f} | {later / first:.2f} |")
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_section("engine", section)


if __name__ == "__main__":
    asyncio.run(main())
