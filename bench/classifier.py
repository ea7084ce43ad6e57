"""The latency `model="auto"` adds: the classifier's decision, through the proxy.

Starts a fast fake upstream and Switchyard (two tiers on it, the shipped classifier, warm), then
sends the same prompts with `model="auto"` and with an explicit model name, interleaved, at
concurrency 1 and 32. Every auto request has a prompt the proxy has not seen (no cache hits),
except in the "cached" rows. Prints added p50/p99 and decisions/s; writes bench/RESULTS.md. With `--by-value`, `auto`
routes among three tiers by value (each tier's predicted quality, LLMRouter's models).

    .venv/bin/python bench/classifier.py [--by-value]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from overhead import (
    AUTH,
    free_port,
    percentile,
    start,
    start_fake_upstream,
    wait_ready,
)  # bench/ is on sys.path as a script
from results import write_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from switchyard.evals.datasets import load_mmlu  # noqa: E402


async def drive(url: str, bodies: list[bytes], concurrency: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    queue = list(bodies)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                started = time.perf_counter()
                async with session.post(url, data=body, headers={"content-type": "application/json", **AUTH}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"status {r.status}")
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, len(bodies) / (time.perf_counter() - began)


def bodies(prompts: list[str], model: str) -> list[bytes]:
    return [
        orjson.dumps({"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": 5}) for p in prompts
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="distinct prompts per concurrency level")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--artifact", type=Path, default=None, help="a classifier artifact folder (default: the shipped MiniLM one)"
    )
    parser.add_argument("--by-value", action="store_true", help="three tiers, routed by predicted quality")
    args = parser.parse_args()
    artifact = f", classifier_artifact: '{args.artifact.resolve()}'" if args.artifact else ""
    from switchyard.classifier.model import DEFAULT_ARTIFACT, ComplexityClassifier

    metadata = ComplexityClassifier.read_metadata(args.artifact or DEFAULT_ARTIFACT)
    embedding, head = metadata["embedding_model"], metadata.get("head", "logistic")
    describe = f"the classifier in {(args.artifact or DEFAULT_ARTIFACT).name} ({embedding}) + {head} head"

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    python = sys.executable
    upstream, proxy_port = start_fake_upstream(logs), free_port()
    config = logs / "switchyard.yaml"
    tiers = ["small", "large", "xl"] if args.by_value else ["small", "large"]
    routing = "thresholds: [0.5]"
    if args.by_value:
        models = ("llama-3.1-8b-instruct", "llama-3.3-nemotron-super-49b-v1", "llama-3.1-nemotron-51b-instruct")
        routing = "quality_models: {" + ", ".join(f"{t}: {m}" for t, m in zip(tiers, models, strict=True)) + "}"
        describe += ", three tiers by value"
    config.write_text(
        "server: {log_level: warning}\n"
        f"routing:\n  auto: {{tiers: [{', '.join(tiers)}], {routing}, deadline_ms: 1000{artifact}}}\n"
        "models:\n" + "".join(f"  - {{name: fake-{t}, base_url: '{upstream.base_url}', tier: {t}}}\n" for t in tiers)
    )
    proxy = start(
        "switchyard",
        [python, "-m", "switchyard", "serve", "--config", str(config), "--port", str(proxy_port)],
        proxy_port,
        logs,
    )
    prompts = [t.prompt for t in load_mmlu()]
    rows = []
    try:
        await wait_ready(upstream)
        await wait_ready(proxy)  # fake-small answers; now warm the classifier
        url = proxy.base_url + "/chat/completions"
        await drive(url, bodies(["warm up the classifier"] * 4, "auto"), 1)
        offset = 0
        for concurrency in (1, 32):
            chosen = prompts[offset : offset + args.requests]
            offset += args.requests
            explicit, _ = await drive(url, bodies(chosen, "fake-small"), concurrency)
            auto, auto_rps = await drive(url, bodies(chosen, "auto"), concurrency)
            cached, cached_rps = await drive(url, bodies(chosen, "auto"), concurrency)
            for label, lat, rps in (("auto, new prompts", auto, auto_rps), ("auto, cached", cached, cached_rps)):
                rows.append(
                    (
                        concurrency,
                        label,
                        percentile(explicit, 0.5),
                        percentile(lat, 0.5),
                        percentile(lat, 0.99) - percentile(explicit, 0.99),
                        rps,
                    )
                )
    finally:
        proxy.stop()
        upstream.stop()

    command_suffix = f" --artifact {args.artifact}" if args.artifact else ""
    command_suffix += " --by-value" if args.by_value else ""
    lines = [
        f"## Auto-routing decision latency (`bench/classifier.py{command_suffix}`)"
        f"\n\nRun {time.strftime('%Y-%m-%d')} on "
        f"{platform.machine()}; {describe} (1 torch thread, "
        "micro-batches up to 32 that start when the worker is free, BLAS on 1 thread), "
        f"{args.requests} distinct MMLU prompts per level; the fake upstream, "
        "proxy and load generator share 2 cores. Added = auto − explicit model name, same prompts.\n",
        "| concurrency | requests | explicit p50 ms | auto p50 ms | added p50 ms | added p99 ms | decisions/s |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c, label, explicit_p50, p50, added_p99, rps in rows:
        lines.append(
            f"| {c} | {label} | {explicit_p50 * 1000:.1f} | {p50 * 1000:.1f} | "
            f"{(p50 - explicit_p50) * 1000:.1f} | {added_p99 * 1000:.1f} | {rps:.0f} |"
        )
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        name = "classifier" if args.artifact is None else f"classifier-{args.artifact.name}"
        write_section(name + ("-by-value" if args.by_value else ""), section)


if __name__ == "__main__":
    asyncio.run(main())
