"""What `/v1/messages` adds over `/v1/chat/completions` for the same answer, through the served
process: one `switchyard serve` in front of the fast fake upstream (`bench/overhead.py`'s), both
endpoints driven in interleaved rounds in one run (c=1 and c=16, whole answers and streams of 50
tokens). Prints requests/s and p50 latency side by side and the ratio; compare figures of one run only.

    .venv/bin/python bench/messages.py --rounds 3 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import orjson
from overhead import Sample, drive, fake_model_yaml, ms, percentile, start_fake_upstream, start_switchyard, wait_ready

PROMPT = "Say fifty words."


def _body(endpoint: str, stream: bool) -> bytes:
    body: dict = {"model": "fake-small", "messages": [{"role": "user", "content": PROMPT}]}
    if endpoint == "/messages":
        body["max_tokens"] = 100
    return orjson.dumps(body | ({"stream": True} if stream else {}))


async def measure(base_url: str, rounds: int, seconds: float) -> list[tuple[str, dict[str, Sample]]]:
    rows = []
    for stream in (False, True):
        for concurrency in (1, 16):
            label = f"c={concurrency} {'stream' if stream else 'non-stream'}"
            print(f"{label} …", file=sys.stderr, flush=True)
            merged = {endpoint: Sample() for endpoint in ("/chat/completions", "/messages")}
            for round_number in range(rounds + 1):  # the first round warms the pools, and is dropped
                for endpoint, sample in merged.items():
                    # a chat stream is checked to end with [DONE]; a Messages stream by its status only
                    got = await drive(
                        base_url + endpoint,
                        _body(endpoint, stream),
                        stream=stream and endpoint == "/chat/completions",
                        concurrency=concurrency,
                        seconds=seconds if round_number else 0.3,
                    )
                    if round_number:
                        sample.latencies_s += got.latencies_s
                        sample.elapsed_s += got.elapsed_s
                        sample.num_errors += got.num_errors
            rows.append((label, merged))
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-messages-"))
    upstream = start_fake_upstream(logs)
    server = start_switchyard(
        logs, "switchyard", "server:\n  log_level: warning\nmodels:\n" + fake_model_yaml("fake-small", upstream)
    )
    try:
        await wait_ready(upstream)
        await wait_ready(server)
        rows = await measure(server.base_url, args.rounds, args.seconds)
    finally:
        server.stop()
        upstream.stop()
    print("| scenario | chat req/s | messages req/s | ratio | chat p50 ms | messages p50 ms | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, samples in rows:
        chat, messages = samples["/chat/completions"], samples["/messages"]
        ratio = messages.rps / chat.rps if chat.rps else 0.0
        print(
            f"| {label} | {chat.rps:.0f} | {messages.rps:.0f} | {ratio:.2f} | {ms(percentile(chat.latencies_s, 0.5))} "
            f"| {ms(percentile(messages.latencies_s, 0.5))} | {chat.num_errors + messages.num_errors} |"
        )
    print(f"logs: {logs}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
