"""The headline benchmarks, measured on what users run: `switchyard serve` started as the README
does, over HTTP, in one sitting.

1. the request path: a config for a fake upstream (`bench/overhead.py`'s), Switchyard beside the
   previous release (a `git archive` run from this venv) and the bare aiohttp pass-through, c=1
   and c=16, whole answers and streams, interleaved rounds; req/s ratios against the targets;
2. readiness: `switchyard serve` with no config (the built-in default), when /health/ready says
   200 and whether every chat model answers at that moment (`bench/readiness.py`);
3. the embedded engine as served with the default config, against plain `generate` in the same
   run (`bench/served_engine.py`, its own section);
4. an upstream that fails in phases under c=32, half the clients streaming (`bench/faults.py`,
   its own section).

Writes the headline table (the `served` section of bench/RESULTS.md) from parts 1 and 2; parts 3
and 4 write their own sections in the same sitting. In-process microbenchmarks (`bench/engine.py`,
`bench/assemble.py`, …) stay for diagnosis.

    make bench-served
    .venv/bin/python bench/served.py --skip engine faults --no-write   # the quick parts only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from overhead import RELEASE, Scenario, Server, run_scenario, start_all, wait_ready
from readiness import measure
from results import RESULTS, write_section

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TARGETS = {"release": 1.0, "passthrough": 0.5}  # Switchyard's req/s over theirs, at least


async def request_path(rounds: int, seconds: float, release: str) -> list[tuple[str, str, float, float]]:
    """(scenario, against, ratio, target) for each scenario and baseline, from one run."""
    logs = Path(tempfile.mkdtemp(prefix="switchyard-served-"))
    servers: dict[str, Server] = start_all(logs, ("direct", "switchyard", "release", "passthrough"), release)
    rows = []
    try:
        for server in servers.values():
            await wait_ready(server)
        for scenario in [Scenario(c, stream, False) for stream in (False, True) for c in (1, 16)]:
            print(f"request path: {scenario.label} …", file=sys.stderr, flush=True)
            await run_scenario(servers, scenario, rounds=1, seconds=0.3)  # warm the pools
            samples = await run_scenario(servers, scenario, rounds, seconds)
            for against, target in TARGETS.items():
                den = samples[against].rps
                rows.append((scenario.label, against, samples["switchyard"].rps / den if den else 0.0, target))
    finally:
        for server in servers.values():
            server.stop()
    return rows


def headline(rows: list[tuple[str, str, float, float]], ready: dict | None, release: str, args) -> str:
    load = os.getloadavg()
    lines = [
        "## Headline: what `switchyard serve` gives (`bench/served.py`)\n",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average at the end {load[0]:.2f}. Every figure through "
        "`switchyard serve` over HTTP, side by side in this run. The request path: the fake upstream "
        f"answering 50 tokens, {args.rounds} interleaved rounds of {args.seconds:g} s per target; the "
        f"previous release is {release}.\n",
        "| what | scenario | figure | target | |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for label, against, ratio, target in rows:
        met = "met" if ratio >= target else "**missed**"
        lines.append(f"| req/s ÷ {against} | {label} | {ratio:.2f}× | ≥ {target:g}× | {met} |")
    if ready is not None:
        answers = ready["first_answers"]
        every_ok = bool(answers) and all(status == "200" for status in answers.values())
        statuses = ", ".join(f"{model} {status}" for model, status in answers.items()) or "none"
        ready_s = "never" if ready["ready_s"] is None else f"{ready['ready_s']:.1f} s"
        lines.append(
            f"| readiness | no config, weights cached | ready after {ready_s}; first answers: {statuses} "
            f"| every answer 200 | {'met' if every_ok else '**missed**'} |"
        )
    lines.append(
        "\nThe engine as served: the `served-engine` section; upstream faults with streams: the `faults` "
        "section (both from this sitting when run by `bench/served.py`)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per request-path scenario")
    parser.add_argument("--seconds", type=float, default=4.0, help="one round of one target")
    parser.add_argument("--release", default=RELEASE, help="the commit to compare against (git archive)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["path", "readiness", "engine", "faults"])
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    rows = asyncio.run(request_path(args.rounds, args.seconds, args.release)) if "path" not in args.skip else []
    ready = asyncio.run(measure(ROOT, timeout_s=600)) if "readiness" not in args.skip else None
    section = headline(rows, ready, args.release, args)
    print(section)
    if not args.no_write:
        write_section("served", section)
    write = [] if not args.no_write else ["--no-write"]
    if "engine" not in args.skip:
        subprocess.run([sys.executable, str(BENCH / "served_engine.py"), *write], check=True)
    if "faults" not in args.skip:
        subprocess.run([sys.executable, str(BENCH / "faults.py"), *write], check=True)
    if not args.no_write:
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
