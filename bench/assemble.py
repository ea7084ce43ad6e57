"""What assembling a non-stream answer from the upstream's stream costs (docs/resilience.md#deadlines).

Two Switchyards in front of one fast fake upstream (50 tokens at once): one with the default
(`assemble_from_stream: true`: the upstream is asked for a stream and the chunks are assembled), one
with `assemble_from_stream: false` (a plain non-stream request, relayed as its bytes). Non-stream
requests only, with and without logprobs, at c=1 and c=16, in interleaved rounds; `direct` is the
upstream's own non-stream answer. Writes the `assemble` section of bench/RESULTS.md.

    .venv/bin/python bench/assemble.py                      # 3 rounds of 2 s per target and scenario
    .venv/bin/python bench/assemble.py --rounds 2 --seconds 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from overhead import (  # bench/ is on sys.path when run as a script
    NUM_TOKENS,
    Sample,
    Scenario,
    Server,
    drive,
    free_port,
    ms,
    percentile,
    start,
    start_fake_upstream,
    wait_ready,
)
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent


def start_switchyard(name: str, upstream: Server, logs: Path, *, assemble: bool) -> Server:
    port = free_port()
    config = logs / f"{name}.yaml"
    config.write_text(
        f"server:\n  log_level: warning\nmodels:\n  - name: fake-small\n    backend: openai\n"
        f"    base_url: {upstream.base_url}\n    api_key: dummy\n"
        f"    assemble_from_stream: {'true' if assemble else 'false'}\n"
    )
    argv = [sys.executable, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port)]
    return start(name, argv, port, logs)


def cpu_s(server: Server) -> float:
    """The server process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(servers: dict[str, Server], scenario: Scenario, rounds: int, seconds: float) -> dict[str, list]:
    """Per target, one (req/s, p50 s, CPU s per request) triple per round."""
    per_round: dict[str, list] = {name: [] for name in servers}
    for server in servers.values():  # warm the pools
        await drive(server.base_url + "/chat/completions", scenario.body(), stream=False, concurrency=2, seconds=0.3)
    for _ in range(rounds):
        for name, server in servers.items():
            cpu_before = cpu_s(server)
            sample: Sample = await drive(
                server.base_url + "/chat/completions",
                scenario.body(),
                stream=False,
                concurrency=scenario.concurrency,
                seconds=seconds,
            )
            if sample.num_errors:
                print(f"    {name}: {sample.num_errors} errors: {sample.error_kinds.most_common(2)}", file=sys.stderr)
            cpu_per_request = (cpu_s(server) - cpu_before) / max(1, len(sample.latencies_s))
            per_round[name].append((sample.rps, percentile(sample.latencies_s, 0.5), cpu_per_request))
    return per_round


def table(results: dict[Scenario, dict[str, list]]) -> str:
    lines = [
        "| scenario | target | req/s | p50 ms | CPU ms per request | assembled ÷ plain req/s "
        "| assembled − plain p50 ms | assembled − plain CPU ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, per_round in results.items():
        medians = {
            name: [statistics.median(m) for m in zip(*rounds, strict=True)] for name, rounds in per_round.items()
        }
        plain_rps, plain_p50, plain_cpu = medians["plain"]
        for name, (rps, p50, cpu) in medians.items():
            is_assembled = name == "assembled"
            cells = [f"{rps / plain_rps:.2f}×", ms(p50 - plain_p50), ms(cpu - plain_cpu)] if is_assembled else ["-"] * 3
            lines.append(
                f"| {scenario.label} | {name} | {rps:.0f} | {ms(p50)} | {ms(cpu)} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-assemble-"))
    upstream = start_fake_upstream(logs)
    servers = {
        "direct": upstream,
        "plain": start_switchyard("plain", upstream, logs, assemble=False),
        "assembled": start_switchyard("assembled", upstream, logs, assemble=True),
    }
    try:
        for server in servers.values():
            await wait_ready(server)
        scenarios = [Scenario(c, False, logprobs) for logprobs in (False, True) for c in args.concurrency]
        results = {}
        for i, scenario in enumerate(scenarios, 1):
            print(f"[{i}/{len(scenarios)}] {scenario.label} …", file=sys.stderr, flush=True)
            results[scenario] = await measure(servers, scenario, args.rounds, args.seconds)
    finally:
        for server in servers.values():
            server.stop()

    section = (
        "## Assembling non-stream answers (`bench/assemble.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: non-stream requests for {NUM_TOKENS} tokens, answered by a Switchyard "
        "that streams from the upstream and assembles the answer (`assembled`, the default) or one that "
        "sends a plain non-stream request (`plain`, `assemble_from_stream: false`); `direct` is the "
        f"upstream itself (its CPU column is the fake's own). CPU is the serving process's user + system time "
        f"per answered request. Medians over {args.rounds} interleaved rounds of {args.seconds:g} s; the upstream, "
        "both proxies and the load generator share the machine.\n\n"
        "    .venv/bin/python bench/assemble.py\n\n" + table(results) + "\n"
    )
    print(section)
    if not args.no_write:
        write_section("assemble", section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
