"""`/v1/embeddings`: the embedded MiniLM's throughput, and the proxy's added latency for a remote model.

1. `local-embed` (all-MiniLM-L6-v2 on the embedded tier) behind `switchyard serve`: embeddings per
   second at 1, 32 and 256 inputs per request (one client, closed loop), and at 1 input with 16
   clients at once (the proxy gathers concurrent requests into one forward pass). Beside each, in
   the same run, the bare model in this process (`SentenceTransformer.encode` on the same batch):
   the ratio is what serving it costs.
2. A remote embedding model (the fake OpenAI upstream answering at once): p50 latency direct, through
   the bare aiohttp pass-through (`bench/passthrough.py`, now with /v1/embeddings) and through
   Switchyard; the added latency is Switchyard's p50 minus the direct one.

    .venv/bin/python bench/embeddings.py                 # writes the embeddings section of RESULTS.md
    .venv/bin/python bench/embeddings.py --seconds 3 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import orjson
from overhead import (  # bench/ is on sys.path when run as a script
    ROOT,
    drive,
    free_port,
    ms,
    percentile,
    start,
    start_fake_upstream,
    start_switchyard,
)
from results import write_section

SENTENCE = "Switchyard routes each request to the cheapest model that answers it well, number {i}."
BATCHES = (1, 32, 256)


def body(model: str, size: int) -> bytes:
    return orjson.dumps(
        {"model": model, "input": [SENTENCE.format(i=i) for i in range(size)], "encoding_format": "float"}
    )


async def wait_embeds(url: str, model: str, timeout_s: float = 180.0) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(
                    url + "/embeddings", data=body(model, 1), headers={"content-type": "application/json"}
                ) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{url} did not embed with {model} in {timeout_s:.0f} s")


def bare_rate(size: int, seconds: float) -> float:
    """Embeddings per second of the model itself, in this process, `size` inputs a call."""
    from switchyard.backends.embedded.minilm import shared_minilm

    model = shared_minilm(1)
    texts = [SENTENCE.format(i=i) for i in range(size)]
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        model.encode(texts, batch_size=64, normalize_embeddings=True)
        done += size
    return done / (time.perf_counter() - began)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    upstream = start_fake_upstream(logs)
    remote = f"  - name: remote-embed\n    kind: embedding\n    base_url: {upstream.base_url}\n    api_key: dummy\n"
    local = "  - name: local-embed\n    backend: embedded\n    model: all-minilm-l6-v2\n    engine: {threads: 1}\n"
    proxy = start_switchyard(logs, "switchyard", "server:\n  log_level: warning\nmodels:\n" + local + remote)
    port = free_port()
    passthrough = start(
        "passthrough",
        [sys.executable, str(ROOT / "bench" / "passthrough.py"), upstream.base_url, str(port)],
        port,
        logs,
    )
    servers = [upstream, proxy, passthrough]
    try:
        await wait_embeds(proxy.base_url, "local-embed")
        await wait_embeds(proxy.base_url, "remote-embed")
        await wait_embeds(passthrough.base_url, "remote-embed")
        rows = []
        for size, clients in [(1, 1), (32, 1), (256, 1), (1, 16)]:
            sample = await drive(
                proxy.base_url + "/embeddings",
                body("local-embed", size),
                stream=False,
                concurrency=clients,
                seconds=args.seconds,
            )
            assert sample.num_errors == 0, sample.error_kinds
            served = len(sample.latencies_s) * size / sample.elapsed_s
            bare = await asyncio.to_thread(bare_rate, size * clients if clients > 1 else size, args.seconds)
            rows.append((size, clients, served, bare, percentile(sample.latencies_s, 0.5)))
            print(f"local-embed {size:>3} inputs × {clients:>2} clients: {served:7.1f}/s (bare {bare:7.1f}/s)")
        remote_rows = []
        for name, url in (
            ("direct", upstream.base_url),
            ("aiohttp pass-through", passthrough.base_url),
            ("switchyard", proxy.base_url),
        ):
            sample = await drive(
                url + "/embeddings", body("remote-embed", 8), stream=False, concurrency=1, seconds=args.seconds
            )
            assert sample.num_errors == 0, sample.error_kinds
            remote_rows.append(
                (name, percentile(sample.latencies_s, 0.5), percentile(sample.latencies_s, 0.99), sample.rps)
            )
            print(f"remote {name}: p50 {ms(remote_rows[-1][1])}")
    finally:
        for server in servers:
            server.stop()
    direct = remote_rows[0][1]
    lines = [
        "## Embeddings (`bench/embeddings.py`)",
        "",
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores; one run, "
        f"{args.seconds:g} s a figure; times in ms.",
        "",
        "`local-embed` (all-MiniLM-L6-v2, one torch thread) behind `switchyard serve`, closed loop, beside the",
        "bare model in the bench's own process on the same inputs (a 15-word sentence each):",
        "",
        "| inputs a request | clients | embeddings/s served | bare model | served ÷ bare | p50 a request |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, clients, served, bare, p50 in rows:
        lines.append(f"| {size} | {clients} | {served:.0f} | {bare:.0f} | {served / bare:.2f}× | {ms(p50)} |")
    lines += [
        "",
        "A remote embedding model (the fake upstream, 8 inputs a request, one client):",
        "",
        "| path | p50 | p99 | req/s | p50 added to direct |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, p50, p99, rps in remote_rows:
        lines.append(
            f"| {name} | {ms(p50)} | {ms(p99)} | {rps:.0f} | {ms(p50 - direct) if name != 'direct' else '—'} |"
        )
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section("embeddings", section)


if __name__ == "__main__":
    asyncio.run(main())
