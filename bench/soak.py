"""Soak: does a `switchyard serve` under steady mixed load keep its memory, file descriptors and ledger?

Starts two fake OpenAI upstreams (a small and a large tier) and one `switchyard serve` in front of
them with two teams and their keys, the ledger in SQLite, `auto` routing (the shipped classifier)
and a two-rung cascade. `--concurrency` closed-loop clients (16) then send, for `--minutes`
minutes, a mix of requests in turn: explicit model non-stream, explicit stream, `auto`
non-stream, `auto` stream, `cascade` non-stream, `cascade` stream, each with a key of one team
and an `x-request-id` of its own.

Each minute it prints (and records) the proxy process's RSS and open file descriptors, the
requests finished in that minute, the errors, and the p50/p99 latency (to the last byte). At the
end: RSS at the last minute against minute 2 (target: within 10%), fd growth (target: none), and
whether the ledger holds exactly one request (attempt 1) per request sent, counted in its SQLite
file after the proxy has stopped. Writes the soak section of bench/RESULTS.md.

    make bench
    .venv/bin/python bench/soak.py --minutes 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from overhead import (  # bench/ is on sys.path when run as a script
    IN_BAND_ERROR,
    Server,
    fake_model_yaml,
    start_fake_upstream,
    start_switchyard,
    wait_ready,
)
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("sk-soak-a1", "sk-soak-a2", "sk-soak-b1", "sk-soak-b2")
PROMPTS = (
    "Say fifty words about the sea.",
    "What is the derivative of x^3 + 2x? Show the steps.",
    "Write a Python function that reverses a linked list.",
    "Name three primary colours.",
    "Prove that the square root of 2 is irrational.",
    "Translate 'good morning' into French.",
)
# (model, stream): the mix each worker walks through, in turn
MIX = (
    ("small", False),
    ("small", True),
    ("auto", False),
    ("auto", True),
    ("cascade", False),
    ("cascade", True),
)


@dataclass
class Minute:
    index: int
    rss_mib: float
    num_fds: int
    num_done: int
    num_errors: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass
class Load:
    num_sent: int = 0
    # (finished at, latency s, error or None), appended as requests finish
    done: list[tuple[float, float, str | None]] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)


def rss_mib(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for {pid}") from None


def num_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def config_yaml(logs: Path, small: Server, large: Server) -> str:
    price = "    price: {input_usd_per_mtok: 0.5, output_usd_per_mtok: 1.5}\n"
    return (
        "server:\n  log_level: warning\n"
        "logging:\n  requests: false\n"
        "routing:\n  auto:\n    tiers: [small, large]\n    thresholds: [0.5]\n"
        # the thrash guard never trips (limit 1): every judged request climbs
        "cascade:\n  ladder: [small, large]\n  thrash: {limit: 1}\n"
        "models:\n"
        + fake_model_yaml("small", small, "    tier: small\n" + price)
        + fake_model_yaml("large", large, "    tier: large\n" + price)
        + f"billing:\n  database_url: sqlite:///{logs / 'usage.db'}\n  spill_path: {logs / 'spill.jsonl'}\n"
        "teams:\n"
        f"  alpha:\n    api_keys: [{KEYS[0]}, {KEYS[1]}]\n    budget_usd_per_day: 1000000\n"
        f"  beta:\n    api_keys: [{KEYS[2]}, {KEYS[3]}]\n    budget_usd_per_day: 1000000\n"
    )


async def run_load(url: str, load: Load, concurrency: int, deadline: float, timeout_s: float) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    counter = itertools.count()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(w: int) -> None:
            while time.monotonic() < deadline:
                n = next(counter)
                model, stream = MIX[n % len(MIX)]
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}],
                    "stream": stream,
                }
                headers = {
                    "content-type": "application/json",
                    "authorization": f"Bearer {KEYS[(n + w) % len(KEYS)]}",
                    "x-request-id": f"soak-{n}",
                }
                load.num_sent += 1
                started = time.monotonic()
                error = None
                try:
                    async with session.post(url, data=orjson.dumps(body), headers=headers) as response:
                        payload = await response.read()
                        if response.status != 200:
                            error = f"{model} {'stream' if stream else 'non-stream'}: status {response.status}"
                        elif stream and (not payload.endswith(b"[DONE]\n\n") or IN_BAND_ERROR in payload):
                            error = f"{model} stream: cut short or in-band error"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = f"{model}: {type(exc).__name__}"
                ended = time.monotonic()
                load.done.append((ended, ended - started, error))
                if error is not None:
                    load.errors[error] += 1
                    await asyncio.sleep(0.05)  # a failing request answers at once; do not spin

        await asyncio.gather(*(worker(w) for w in range(concurrency)))


def summarize(index: int, pid: int, finished: list[tuple[float, float, str | None]]) -> Minute:
    latencies = sorted(latency for _, latency, error in finished if error is None)
    p50 = p99 = None
    if len(latencies) >= 2:
        quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
        p50, p99 = quantiles[49] * 1000, quantiles[98] * 1000
    return Minute(
        index,
        rss_mib(pid),
        num_fds(pid),
        len(finished),
        sum(error is not None for _, _, error in finished),
        p50,
        p99,
    )


def ledger_counts(db: Path) -> tuple[int, int, int]:
    """(distinct soak request ids, first attempts, requests with a second attempt) in the ledger."""
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT COUNT(DISTINCT client_request_id), SUM(attempt = 1), "
            "COUNT(DISTINCT CASE WHEN attempt > 1 THEN client_request_id END) FROM usage "
            "WHERE client_request_id LIKE 'soak-%'"
        ).fetchone()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(minutes: list[Minute]) -> str:
    lines = [
        "| minute | RSS MiB | open fds | requests | errors | p50 ms | p99 ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in minutes:
        lines.append(
            f"| {m.index} | {m.rss_mib:.1f} | {m.num_fds} | {m.num_done} | {m.num_errors} "
            f"| {_ms(m.p50_ms)} | {_ms(m.p99_ms)} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=10, help="how long the load runs")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="a request unanswered by then is an error")
    parser.add_argument("--note", default="", help="a sentence added to the notes in RESULTS.md")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    if args.minutes < 1:
        parser.error("--minutes must be at least 1")

    logs = Path(tempfile.mkdtemp(prefix="switchyard-soak-"))
    small = start_fake_upstream(logs, name="upstream-small")
    large = start_fake_upstream(logs, name="upstream-large")
    proxy = start_switchyard(logs, "switchyard", config_yaml(logs, small, large))
    load = Load()
    minutes: list[Minute] = []
    try:
        for server in (small, large):
            await wait_ready(server, model=server.name)
        await _wait_proxy(proxy)
        pid = proxy.process.pid
        print(f"proxy pid {pid}, logs in {logs}", file=sys.stderr)
        began = time.monotonic()
        deadline = began + 60 * args.minutes
        runner = asyncio.create_task(
            run_load(proxy.base_url + "/chat/completions", load, args.concurrency, deadline, args.timeout_s)
        )
        seen = 0
        for index in range(1, args.minutes + 1):
            await asyncio.sleep(max(0.0, began + 60 * index - time.monotonic()))
            if proxy.process.poll() is not None:
                raise RuntimeError(f"the proxy exited with {proxy.process.returncode}; see {logs}")
            finished, seen = load.done[seen:], len(load.done)
            minute = summarize(index, pid, finished)
            minutes.append(minute)
            print(
                f"minute {index}: RSS {minute.rss_mib:.1f} MiB, {minute.num_fds} fds, {minute.num_done} requests, "
                f"{minute.num_errors} errors, p50 {_ms(minute.p50_ms)} ms, p99 {_ms(minute.p99_ms)} ms",
                flush=True,
            )
        await runner
    finally:
        proxy.stop()  # SIGINT: the ledger's writer flushes before the process ends
        small.stop()
        large.stop()

    num_requests, num_first, num_climbed = ledger_counts(logs / "usage.db")
    base = minutes[1] if len(minutes) >= 2 else minutes[0]
    last = minutes[-1]
    rss_change = (last.rss_mib - base.rss_mib) / base.rss_mib
    fd_growth = last.num_fds - base.num_fds
    # pooled upstream connections come and go (keep-alive expiry), so a few fds up or down between
    # minutes is noise: growth is the last minute above every minute of the first half (from minute 2)
    early = minutes[1 : max(2, len(minutes) // 2 + 1)] if len(minutes) >= 2 else minutes
    early_max = max(m.num_fds for m in early)
    fds = [m.num_fds for m in minutes[1:] or minutes]
    ledger_ok = num_requests == num_first == load.num_sent
    verdicts = [
        f"RSS at minute {last.index} vs minute {base.index}: {base.rss_mib:.1f} → {last.rss_mib:.1f} MiB "
        f"({rss_change:+.1%}; target within ±10%: {'met' if abs(rss_change) <= 0.10 else 'MISSED'})",
        f"open fds at minute {last.index} vs minute {base.index}: {base.num_fds} → {last.num_fds} "
        f"({fd_growth:+d}; {min(fds)}–{max(fds)} from minute {base.index} on; target no growth, the last minute "
        f"at most the first half's highest, {early_max}: {'met' if last.num_fds <= early_max else 'MISSED'})",
        f"ledger: {load.num_sent} requests sent, {num_requests} distinct request ids and {num_first} first "
        f"attempts in the ledger ({num_climbed} of them with a second attempt, the cascade's climb): "
        f"{'exactly one record per request' if ledger_ok else 'MISMATCH'}",
        f"errors: {sum(load.errors.values())}"
        + (" (" + ", ".join(f"{n} × {e}" for e, n in load.errors.most_common()) + ")" if load.errors else ""),
    ]
    for line in verdicts:
        print(line)
    section = (
        "## Soak: memory, file descriptors and the ledger under steady load (`bench/soak.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: `.venv/bin/python bench/soak.py --minutes {args.minutes}`. One "
        f"`switchyard serve` in front of two fake upstreams (tiers small and large), two teams with two "
        f"keys each, the ledger in SQLite, c={args.concurrency} closed-loop clients sending in turn "
        "explicit non-stream and stream, `auto` (the shipped classifier) non-stream and stream, `cascade` "
        "(small → large) non-stream and stream. Per minute: the proxy process's RSS and open file "
        "descriptors at the minute's end, the requests finished in it, errors, latency to the last byte.\n\n"
        f"{table(minutes)}\n\n" + "\n".join(f"- {line}" for line in verdicts) + "\n\n"
        "Notes: minute 1 includes the warm-up (the classifier, connection pools, the SQLite file growing), "
        "so memory is compared from minute 2 on. The ledger is counted after the proxy stopped (SIGINT "
        "flushes its writer): one row per attempt, so a request the cascade escalated has two rows and "
        "counts once by its `x-request-id`. The fake upstreams' logprobs put every judged answer below "
        "the default threshold and the thrash guard is off (`limit: 1`), so every `cascade` request, "
        "and every `auto` one routed to small, climbs to large: a stream's cheap rung is cancelled "
        "after 16 tokens each time, the path most likely to leak. Open fds move by a few between minutes "
        "as pooled upstream connections expire and reopen (keep-alive 4 s), hence the fd target compares "
        "the last minute with the first half's highest." + (f" {args.note}" if args.note else "") + "\n"
    )
    print(section)
    if not args.no_write:
        write_section("soak", section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


async def _wait_proxy(proxy: Server, timeout_s: float = 300.0) -> None:
    """Ready when an explicit, an `auto` and a `cascade` request answer (the classifier is warm).
    These warm-up requests carry no `soak-` request id, so the ledger count leaves them out."""
    headers = {"authorization": f"Bearer {KEYS[0]}", "x-request-id": "warm-up"}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        for model in ("small", "auto", "cascade"):
            body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 2}
            while True:
                if proxy.process.poll() is not None:
                    raise RuntimeError(f"the proxy exited with {proxy.process.returncode}; see its log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the proxy did not answer {model!r} within {timeout_s:.0f} s")
                try:
                    async with session.post(proxy.base_url + "/chat/completions", json=body, headers=headers) as r:
                        await r.read()
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25)


if __name__ == "__main__":
    asyncio.run(main())
