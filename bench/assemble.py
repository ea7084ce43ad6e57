"""What assembling a non-stream answer from the upstream's stream costs (docs/resilience.md#non-stream-requests).

Switchyards in front of one fast fake upstream (50 tokens at once): one with the default
(`assembled`: the upstream is asked for a stream and the answer assembled), one with
`assemble_from_stream: false` (`plain`: a non-stream request, relayed as its bytes), and, with
`--before COMMIT`, that commit's code with `assemble_from_stream: true` (`before`, a `git archive`
run from this same venv). Non-stream requests only, with and without logprobs, at c=1 and c=16, in
interleaved rounds; `direct` is the upstream's own non-stream answer. Writes the `assemble` section
of bench/RESULTS.md.

    .venv/bin/python bench/assemble.py                      # 3 rounds of 2 s per target and scenario
    .venv/bin/python bench/assemble.py --rounds 2 --seconds 1 --no-write --before 9399d42
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
    archive,
    drive,
    fake_model_yaml,
    ms,
    percentile,
    start_fake_upstream,
    start_switchyard,
    wait_ready,
)
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent


def start_proxy(name: str, upstream: Server, logs: Path, *, assemble: bool | None, tree: Path = ROOT) -> Server:
    """`assemble=None`: the model's default."""
    extra = "" if assemble is None else f"    assemble_from_stream: {'true' if assemble else 'false'}\n"
    config_yaml = "server:\n  log_level: warning\nmodels:\n" + fake_model_yaml("fake-small", upstream, extra)
    return start_switchyard(logs, name, config_yaml, tree=tree)


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
        "| scenario | target | req/s | p50 ms | CPU ms per request | ÷ plain req/s | − plain p50 ms | − plain CPU ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, per_round in results.items():
        medians = {
            name: [statistics.median(m) for m in zip(*rounds, strict=True)] for name, rounds in per_round.items()
        }
        plain_rps, plain_p50, plain_cpu = medians["plain"]
        for name, (rps, p50, cpu) in medians.items():
            is_assembled = name in ("assembled", "before")
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
    parser.add_argument("--before", metavar="COMMIT", help="also run this commit's code, assembling (`before`)")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-assemble-"))
    upstream = start_fake_upstream(logs)
    servers = {
        "direct": upstream,
        "plain": start_proxy("plain", upstream, logs, assemble=False),
        "assembled": start_proxy("assembled", upstream, logs, assemble=None),
    }
    if args.before:
        servers["before"] = start_proxy("before", upstream, logs, assemble=True, tree=archive(args.before, logs))
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
        "sends a plain non-stream request (`plain`, `assemble_from_stream: false`)"
        + (f", and commit {args.before} assembling (`before`)" if args.before else "")
        + "; `direct` is the "
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
