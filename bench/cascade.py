"""Time to first token that the cascade's streaming decision adds, on the embedded models.

Runs Switchyard in this process with two embedded engines (local-small: SmolLM2-135M; local-large:
Gemma-3-270M when installed, else a second SmolLM2) and streams the same prompts, one at a time:

- the cheap rung alone (`model="local-small"`): the baseline TTFT;
- `model="cascade"` with a threshold every answer passes, at k = 8, 16, 32 buffered tokens, with
  the default 300 ms budget and with no budget (k alone decides): the decision's own cost;
- `model="cascade"` with a threshold no answer passes (k = 16, 300 ms): TTFT of an escalation.

TTFT is measured at the client, to the first chunk with text. Prints the table; writes
bench/RESULTS.md.

    .venv/bin/python bench/cascade.py
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import platform
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import orjson
from results import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from switchyard.backends.embedded.models import is_installed  # noqa: E402
from switchyard.core.settings import Settings  # noqa: E402
from switchyard.proxy.app import create_app  # noqa: E402
from tests.fakes.server import serve_in_thread  # noqa: E402

PROMPTS = [
    "Name three primary colours.",
    "What is the capital of Italy?",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
    "Give me a synonym for 'happy'.",
    "What do bees make?",
    "Say hello in French.",
    "What is 12 plus 7?",
]
NO_BUDGET_MS = 60_000.0


async def ttft(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    async with session.post(url, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"status {response.status}: {await response.text()}")
        answered_by = response.headers.get("x-switchyard-model", "")
        async for line in response.content:
            if first is None and line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    first = time.perf_counter() - started
    assert first is not None, "no text streamed"
    return first, answered_by


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    large = "gemma3-270m" if is_installed("gemma3-270m") else "smollm2-135m"
    settings = Settings(
        server={"log_level": "warning"},
        billing={"ledger_path": None},
        models=[
            {"name": "local-small", "backend": "embedded", "model": "smollm2-135m"},
            {"name": "local-large", "backend": "embedded", "model": large},
        ],
        cascade={"ladder": ["local-small", "local-large"], "scorer": "first_mean_logprob", "threshold": -1e9},
    )
    app = create_app(settings)
    prompts = PROMPTS[: args.prompts]
    rows: list[tuple[str, float, float, str]] = []
    with serve_in_thread(app) as base:
        url = base + "/v1/chat/completions"

        async def run() -> None:
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 600
                while True:
                    async with session.get(base + "/health/ready") as r:
                        if r.status == 200:
                            break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the embedded models did not load")
                    await asyncio.sleep(0.5)
                for prompt in prompts[:2]:  # warm both engines
                    await ttft(session, url, "local-small", prompt, 4)
                    await ttft(session, url, "local-large", prompt, 4)

                async def measure(label: str, model: str, **policy) -> None:
                    cascade = app.state.services.cascade
                    cascade.policy = dataclasses.replace(cascade.policy, **policy)
                    times, answered = [], set()
                    for prompt in prompts:
                        seconds, by = await ttft(session, url, model, prompt, args.max_tokens)
                        times.append(seconds)
                        answered.add(by)
                    rows.append((label, statistics.median(times), max(times), ", ".join(sorted(answered))))
                    print(f"{label}: median {statistics.median(times) * 1000:.0f} ms", flush=True)

                await measure("local-small alone", "local-small")
                for k in (8, 16, 32):
                    await measure(
                        f"cascade, accepted, k={k}, 300 ms budget", "cascade", stream_tokens=k, stream_budget_s=0.3
                    )
                    await measure(
                        f"cascade, accepted, k={k}, no budget",
                        "cascade",
                        stream_tokens=k,
                        stream_budget_s=NO_BUDGET_MS / 1000,
                    )
                await measure("local-large alone", "local-large")
                rungs = app.state.services.cascade.rungs
                rungs[0] = dataclasses.replace(rungs[0], threshold=1e9)  # nothing passes: every request escalates
                await measure(
                    "cascade, escalated, k=16, 300 ms budget", "cascade", stream_tokens=16, stream_budget_s=0.3
                )

        asyncio.run(run())

    base_ttft = rows[0][1]
    lines = [
        f"## Cascade streaming decision (`bench/cascade.py`)\n\nRun {time.strftime('%Y-%m-%d')} on "
        f"{platform.machine()}, 2 cores; local-small = SmolLM2-135M, local-large = "
        f"{large}, both on the embedded engine in the proxy's process; {len(prompts)} prompts, one at a time, "
        f"max_tokens {args.max_tokens}, temperature 0. TTFT at the client to the first chunk with text. "
        "Added = median − the cheap rung's median.\n",
        "| requests | median TTFT ms | added ms | × cheap rung alone | max ms | answered by |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for label, median, worst, by in rows:
        lines.append(
            f"| {label} | {median * 1000:.0f} | {(median - base_ttft) * 1000:+.0f} | {median / base_ttft:.2f} | "
            f"{worst * 1000:.0f} | {by} |"
        )
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_section("cascade", section)


if __name__ == "__main__":
    main()
