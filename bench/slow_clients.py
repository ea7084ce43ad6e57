"""Normal traffic while hostile connections are held open: does the proxy keep serving?

Starts a fake OpenAI upstream and `switchyard serve` in front of it (its default connection
settings), opens N idle connections (connect, send nothing), N slow-header connections (a request
line, then one byte of header per second) and N slow-body connections (whole headers with a
Content-Length of 1,000, then one byte of body per second), and meanwhile runs normal traffic
(c=8 closed loop, non-stream) for `--seconds`; the hostile connections are held for
`--hold-seconds` in all. Reports normal traffic's success rate, p50 and p99, and how many hostile
connections the server closed, when (seconds after they opened) and with what it answered them.
Each N > 0 runs twice: with the shell's file-descriptor limit, and with the server under
`ulimit -n 1024` (set in its subprocess before it starts).

    make bench                                      # N = 0, 200, 1000; both fd limits
    .venv/bin/python bench/slow_clients.py --num-hostile 200 --seconds 10 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import resource
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from overhead import (  # bench/ is on sys.path when run as a script
    Sample,
    drive,
    fake_model_yaml,
    percentile,
    start_fake_upstream,
    start_switchyard,
    wait_ready,
)
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("idle", "slow-header", "slow-body")
BODY = orjson.dumps({"model": "fake-small", "messages": [{"role": "user", "content": "Say fifty words."}]})
REQUEST_TIMEOUT_S = 10.0  # a normal request with no answer by then is a failure
LOW_FD_LIMIT = 1024


@dataclass
class Hostile:
    kind: str
    opened_at: float
    closed_after_s: float | None = None
    answer: str = ""  # the status line the server sent before closing, if any


@dataclass
class Run:
    num_hostile: int
    fd_limit: int | None
    normal: Sample = field(default_factory=Sample)
    hostile: list[Hostile] = field(default_factory=list)
    num_refused: Counter = field(default_factory=Counter)  # hostile connections that could not even open

    @property
    def label(self) -> str:
        return f"N={self.num_hostile}, server fd limit {self.fd_limit or 'default'}"


def _prefix(kind: str, port: int) -> bytes:
    """What a hostile connection sends at once; the rest trickles one byte a second."""
    if kind == "idle":
        return b""
    if kind == "slow-header":
        return b"POST /v1/chat/completions HTTP/1.1\r\n"
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: 1000\r\n\r\n"
    ).encode()


async def _hold(kind: str, port: int, stop: asyncio.Event, run: Run) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    except (OSError, TimeoutError) as exc:
        run.num_refused[f"{kind}: {type(exc).__name__}"] += 1
        return
    hostile = Hostile(kind, time.monotonic())
    run.hostile.append(hostile)

    async def trickle() -> None:
        if kind == "idle":
            await stop.wait()
            return
        writer.write(_prefix(kind, port))
        filler = b"X-Slow: y" if kind == "slow-header" else b" "
        i = 0
        while True:
            await asyncio.sleep(1)
            writer.write(filler[i % len(filler) : i % len(filler) + 1])
            await writer.drain()
            i += 1

    trickler = asyncio.create_task(trickle())
    closer = asyncio.create_task(reader.read(200))
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({closer, trickler, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not stopper.done():  # the server answered or closed (a write to a closed socket fails)
            hostile.closed_after_s = time.monotonic() - hostile.opened_at
            data = closer.result() if closer.done() and not closer.exception() else b""
            hostile.answer = data.split(b"\r\n", 1)[0].decode(errors="replace")[:40] or "closed"
    finally:
        for task in (trickler, closer, stopper):
            task.cancel()
        await asyncio.gather(trickler, closer, stopper, return_exceptions=True)
        writer.close()


async def run_once(
    logs: Path, upstream, num_hostile: int, fd_limit: int | None, seconds: float, hold_seconds: float
) -> Run:
    def limit_fds() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    name = f"switchyard-n{num_hostile}-fd{fd_limit or 'default'}"
    config = "server:\n  log_level: warning\nmodels:\n" + fake_model_yaml("fake-small", upstream)
    server = start_switchyard(logs, name, config, preexec_fn=limit_fds if fd_limit else None)
    run = Run(num_hostile, fd_limit)
    try:
        await wait_ready(server)
        port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
        stop = asyncio.Event()
        holders = []
        for kind in KINDS:
            for _ in range(num_hostile):
                holders.append(asyncio.create_task(_hold(kind, port, stop, run)))
                if len(holders) % 100 == 0:
                    await asyncio.sleep(0.05)  # open them at a steady pace, not all in one burst
        began = time.monotonic()
        await asyncio.sleep(1)
        run.normal = await drive(
            server.base_url + "/chat/completions",
            BODY,
            stream=False,
            concurrency=8,
            seconds=seconds,
            timeout_s=REQUEST_TIMEOUT_S,
        )
        if num_hostile:
            await asyncio.sleep(max(0.0, hold_seconds - (time.monotonic() - began)))
        stop.set()
        await asyncio.gather(*holders)
    finally:
        server.stop()
    return run


def _closed_cell(run: Run, kind: str) -> str:
    held = [h for h in run.hostile if h.kind == kind]
    closed = sorted(h.closed_after_s for h in held if h.closed_after_s is not None)
    refused = sum(n for key, n in run.num_refused.items() if key.startswith(kind + ":"))
    if not held and not refused:
        return "-"
    text = f"{len(closed)}/{len(held)}"
    if closed:
        text += f" after {percentile(closed, 0.5):.0f}–{closed[-1]:.0f} s"
    if refused:
        text += f" ({refused} never connected)"
    return text


def _answers(run: Run) -> str:
    counts = Counter(f"{h.kind}: {h.answer}" for h in run.hostile if h.closed_after_s is not None)
    return "; ".join(f"{n} × {answer}" for answer, n in counts.most_common(4)) or "-"


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def table(runs: list[Run]) -> str:
    lines = [
        "| hostile connections | server fd limit | normal ok | p50 ms | p99 ms | idle closed | "
        "slow-header closed | slow-body closed | what the closed ones got |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        sample = run.normal
        total = len(sample.latencies_s) + sample.num_errors
        ok = f"{len(sample.latencies_s)}/{total} ({100 * len(sample.latencies_s) / total:.1f}%)" if total else "0/0"
        lines.append(
            f"| {run.num_hostile} × 3 | {run.fd_limit or 'default'} | {ok} "
            f"| {_ms(percentile(sample.latencies_s, 0.5))} | {_ms(percentile(sample.latencies_s, 0.99))} "
            f"| {' | '.join(_closed_cell(run, kind) for kind in KINDS)} | {_answers(run)} |"
        )
    return "\n".join(lines)


def _raise_own_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-hostile", type=int, nargs="+", default=[0, 200, 1000], help="N of each kind")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the normal traffic")
    parser.add_argument("--hold-seconds", type=float, default=45.0, help="how long hostile connections are held")
    parser.add_argument("--fd-limits", nargs="+", default=["default", str(LOW_FD_LIMIT)])
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    _raise_own_fd_limit(3 * max(args.num_hostile) + 1024)

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    upstream = start_fake_upstream(logs)
    runs: list[Run] = []
    try:
        await wait_ready(upstream)
        for num_hostile in args.num_hostile:
            for limit in args.fd_limits if num_hostile else args.fd_limits[:1]:
                fd_limit = None if limit == "default" else int(limit)
                print(f"N={num_hostile} × 3, fd limit {limit} …", file=sys.stderr, flush=True)
                run = await run_once(logs, upstream, num_hostile, fd_limit, args.seconds, args.hold_seconds)
                runs.append(run)
                for kind, count in run.normal.error_kinds.most_common(3):
                    print(f"    {count} × {kind}", file=sys.stderr)
    finally:
        upstream.stop()

    default_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    section = (
        "## Slow and idle clients (`bench/slow_clients.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: `.venv/bin/python bench/slow_clients.py "
        f"--num-hostile {' '.join(map(str, args.num_hostile))} --seconds {args.seconds:g} "
        f"--hold-seconds {args.hold_seconds:g}`. "
        f"`switchyard serve` with its default connection settings in front of a fake upstream "
        f"(50 tokens at once); N idle + N slow-header (1 byte/s) + N slow-body (1 byte/s of a "
        f"1,000-byte body) connections held while 8 closed-loop clients send normal requests for "
        f"{args.seconds:g} s (a request with no answer in {REQUEST_TIMEOUT_S:g} s fails). The server's fd "
        f'limit is the shell\'s ({default_limit}) or {LOW_FD_LIMIT} (set in its subprocess). "closed": '
        f"hostile connections the server closed within {args.hold_seconds:g} s of opening, and after how "
        f"long (median–max).\n\n{table(runs)}\n"
    )
    print(section)
    if not args.no_write:
        write_section("slow-clients", section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
