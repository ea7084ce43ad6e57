"""What the response cache adds to a request, through the served process: three `switchyard serve`
processes in front of the fast fake upstream (`bench/overhead.py`'s), one with the cache off, one
with `cache.mode: exact`, one with `semantic`, driven one at a time in interleaved rounds, c=1,
whole answers, temperature 0. Misses are new prompts each time (each one stored); exact hits repeat
a few prompts; semantic hits ask reworded versions of stored prompts. Prints p50/p90 latency and
what the `x-switchyard-cache` header said; the target is a hit under 2 ms and a miss under 1 ms
added at p50 beyond the cache-off proxy. Compare figures of one run only.

    .venv/bin/python bench/cache.py --rounds 3 --seconds 3 [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson
from overhead import AUTH, Server, fake_model_yaml, ms, percentile, start_fake_upstream, start_switchyard, wait_ready
from results import write_section

STORED = [
    "How do I reset my password on the staff portal?",
    "What is the capital of Australia?",
    "Summarise the plot of Hamlet in two sentences.",
    "Which HTTP status code means the resource was not found?",
]
REWORDED = ["Please tell me: {}", "{} Thanks!", "Quick question. {}", "Hi! {}"]


@dataclass
class Tally:
    latencies_s: list[float] = field(default_factory=list)
    said: Counter = field(default_factory=Counter)  # x-switchyard-cache values (similarity dropped)
    num_errors: int = 0


def body(prompt: str) -> bytes:
    return orjson.dumps({"model": "fake-small", "temperature": 0, "messages": [{"role": "user", "content": prompt}]})


async def drive(url: str, prompts: Callable[[], str], seconds: float, tally: Tally | None) -> None:
    """One closed-loop client for `seconds`; each latency to the last byte."""
    headers = {"content-type": "application/json"} | AUTH
    async with aiohttp.ClientSession() as session:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            async with session.post(url, data=body(prompts()), headers=headers) as response:
                await response.read()
                said = response.headers.get("x-switchyard-cache", "none").split(";")[0]
            if tally is None:
                continue
            if response.status != 200:
                tally.num_errors += 1
                continue
            tally.latencies_s.append(time.perf_counter() - started)
            tally.said[said] += 1


def scenarios() -> dict[str, tuple[str, Callable[[], str]]]:
    """name -> (the server it runs on, the prompt of each next request)."""
    fresh = itertools.count()
    repeated = itertools.cycle(STORED)
    reworded = itertools.cycle([form.format(prompt) for form in REWORDED for prompt in STORED])
    return {
        "cache off": ("off", lambda: f"Tell me about item {next(fresh)} of the catalogue."),
        "exact, miss": ("exact", lambda: f"Tell me about item {next(fresh)} of the catalogue."),
        "exact, hit": ("exact", lambda: next(repeated)),
        "semantic, miss": ("semantic", lambda: f"Tell me about item {next(fresh)} of the catalogue."),
        "semantic, hit": ("semantic", lambda: next(reworded)),
    }


async def measure(servers: dict[str, Server], rounds: int, seconds: float) -> dict[str, Tally]:
    for server in servers.values():  # the stored prompts, asked once (semantic: also their exact entries)
        for prompt in STORED:
            await drive(server.base_url + "/chat/completions", lambda p=prompt: p, 0.0001, None)
    tallies = {name: Tally() for name in scenarios()}
    plan = scenarios()
    for round_number in range(rounds + 1):  # the first round warms the pools, and is dropped
        for name, (server, prompts) in plan.items():
            print(f"round {round_number}: {name} …", file=sys.stderr, flush=True)
            url = servers[server].base_url + "/chat/completions"
            await drive(url, prompts, seconds if round_number else 0.3, tallies[name] if round_number else None)
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    base = percentile(tallies["cache off"].latencies_s, 0.5)
    lines = [
        "| scenario | requests | p50 ms | p90 ms | p50 added ms | x-switchyard-cache | errors |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for name, tally in tallies.items():
        p50 = percentile(tally.latencies_s, 0.5)
        said = ", ".join(f"{value} {count}" for value, count in tally.said.most_common())
        added = "" if name == "cache off" else f"{(p50 - base) * 1000:+.2f}"
        lines.append(
            f"| {name} | {len(tally.latencies_s)} | {ms(p50)} | {ms(percentile(tally.latencies_s, 0.9))} "
            f"| {added} | {said} | {tally.num_errors} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-cache-"))
    upstream = start_fake_upstream(logs)
    servers: dict[str, Server] = {}
    try:
        head = "server:\n  log_level: warning\n"
        models = "models:\n" + fake_model_yaml("fake-small", upstream)
        for mode in ("off", "exact", "semantic"):
            cache = f"cache:\n  mode: {mode}\n" if mode != "off" else ""
            servers[mode] = start_switchyard(logs, f"cache-{mode}", head + cache + models)
        await wait_ready(upstream)
        for server in servers.values():
            await wait_ready(server)
        tallies = await measure(servers, args.rounds, args.seconds)
    finally:
        for server in servers.values():
            server.stop()
        upstream.stop()
    result = table(tallies)
    print(result)
    if args.write:
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
        write_section(
            "cache",
            f"## The response cache through the served process (`bench/cache.py`)\n\n"
            f"Run {when} UTC on {platform.machine()}, {platform.python_version()}; three `switchyard serve` "
            f"processes (cache off, `exact`, `semantic`) in front of the fast fake upstream, c=1, whole answers, "
            f"{args.rounds} interleaved rounds of {args.seconds:g} s each, in this one run.\n\n{result}\n",
        )
    print(f"logs: {logs}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
