"""The embedded engine as users get it: `switchyard serve` with the built-in default config, over HTTP.

`bench/engine.py` drives one engine in-process with nothing else loaded; this one starts
`switchyard serve` with no config file (local-small, local-large and local-embed loaded, the
`auto` classifier warmed up), as the README does, and asks `local-small` over HTTP (streamed,
greedy, `--new-tokens` tokens) against plain transformers `generate` at batch 1 on the same
converted weights, loaded in this process. Each round runs plain `generate` and then each server
on every workload, so a slow moment of the machine hits all of them alike; the figures to compare
are the ratios of one run.

- free writing at concurrency 1 and 32, and copy-heavy answers (repeat a paragraph, rename a
  function) at concurrency 1: tokens/s, and × plain generate;
- a shared system prompt (`--prefix-tokens`): requests one after another, time to first token of
  the first and the median of the later ones (each round has a system prompt of its own, so its
  first request finds nothing cached);
- every answer checked against plain `generate`'s, token for token (as text).

`--before COMMIT` adds the server of that commit (a `git archive` of it, run from this venv) beside
this checkout's; `--profile` then runs free writing at c=1 and c=32 once more on each server,
untimed, under py-spy (Python frames, without pausing the server), and prints where the time goes.
Both servers and this process share one model conversion cache (`--cache-dir`, default
`~/.cache/switchyard`), so only the first run converts.

    .venv/bin/python bench/served_engine.py --before 4be78c4 --profile
    .venv/bin/python bench/served_engine.py --rounds 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from engine import COPY_TASKS, SYSTEM_SENTENCE, TOPICS  # bench/ is on sys.path when run as a script
from overhead import ROOT, Server, archive, free_port, wait_ready
from results import write_section

MODEL = "local-small"
AUTH = {"authorization": "Bearer sk-bench", "content-type": "application/json"}


def free_prompts(n: int) -> list[list[dict]]:
    topics = [TOPICS[i % len(TOPICS)] for i in range(n)]
    return [[{"role": "user", "content": f"Write a short story about {t} (#{i})."}] for i, t in enumerate(topics)]


def copy_prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": COPY_TASKS[i % len(COPY_TASKS)]}] for i in range(n)]


def prefix_prompts(tokenizer, n: int, num_prefix_tokens: int, nonce: str) -> list[list[dict]]:
    system = f"Session {nonce}. "
    while len(tokenizer.encode(system)) < num_prefix_tokens:
        system += SYSTEM_SENTENCE
    return [
        [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: {t}?"}]
        for i, t in enumerate((TOPICS * n)[:n])
    ]


# -- the servers ------------------------------------------------------------------------------------


def start_default_server(name: str, tree: Path, logs: Path, cache_dir: Path) -> Server:
    """`switchyard serve` with no config, from the code in `tree`, in an empty folder of its own (no
    ./switchyard.yaml) with a home of its own; the conversion cache is the shared one. The
    environment is this one's, minus anything that would tune the engine (users set none of it)."""
    port = free_port()
    home = logs / f"{name}-home"
    home.mkdir()
    tuned = ("SWITCHYARD", "OMP_", "MKL_", "KMP_", "GOMP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuned)}
    env |= {"HOME": str(home), "PYTHONPATH": str(tree), "SWITCHYARD_CACHE_DIR": str(cache_dir)}
    argv = [sys.executable, "-m", "switchyard", "serve", "--port", str(port)]
    log = (logs / f"{name}.log").open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    return Server(name, f"http://127.0.0.1:{port}/v1", process)


async def ask(
    session: aiohttp.ClientSession, server: Server, messages: list[dict], max_tokens: int, model: str = MODEL
):
    """(text, completion tokens, seconds to the first content, seconds to the end) of one streamed answer."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    num_tokens = 0
    async with session.post(server.base_url + "/chat/completions", data=orjson.dumps(body), headers=AUTH) as response:
        if response.status != 200:
            raise RuntimeError(f"{server.name}: status {response.status}: {(await response.read())[:200]!r}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{server.name}: {chunk['error']}")
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    first = first if first is not None else time.perf_counter() - started
                    parts.append(text)
    return "".join(parts), num_tokens, first or 0.0, time.perf_counter() - started


async def served_rate(
    server: Server, prompts: list[list[dict]], concurrency: int, max_tokens: int, model: str = MODEL
) -> tuple[float, list[str]]:
    """tokens/s over all of `prompts`, `concurrency` at a time, and the answers in prompt order."""
    answers: list[str] = [""] * len(prompts)
    pending = collections.deque(enumerate(prompts))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> int:
            count = 0
            while pending:
                index, messages = pending.popleft()
                answers[index], num_tokens, _, _ = await ask(session, server, messages, max_tokens, model)
                count += num_tokens
            return count

        started = time.perf_counter()
        counts = await asyncio.gather(*(worker() for _ in range(concurrency)))
        return sum(counts) / (time.perf_counter() - started), answers


async def served_ttft(server: Server, prompts: list[list[dict]]) -> tuple[float, float]:
    """Time to first token (ms) of the first request and the median of the later ones, one at a time."""
    ttfts = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for messages in prompts:
            _, _, first, _ = await ask(session, server, messages, 4)
            ttfts.append(first * 1000)
    return ttfts[0], statistics.median(ttfts[1:])


# -- plain generate ---------------------------------------------------------------------------------


class Plain:
    """Plain transformers `generate`, batch 1, greedy, on the servers' converted weights."""

    def __init__(self, cache_dir: Path) -> None:
        from switchyard.backends.embedded.models import converted_dir, resolve_model

        folder = converted_dir(resolve_model("smollm2-135m"), cache_dir / "models")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
        self.answers: dict[str, str] = {}

    def ids(self, messages: list[dict]) -> list[int]:
        template = self.tokenizer.apply_chat_template
        return template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)

    def answer(self, messages: list[dict], max_tokens: int) -> tuple[str, int]:
        ids = self.ids(messages)
        with self.torch.no_grad():
            out = self.model.generate(
                self.torch.tensor([ids]),
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        new = out[0, len(ids) :].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        self.answers[orjson.dumps(messages).decode()] = text
        return text, len(new)

    def rate(self, prompts: list[list[dict]], max_tokens: int) -> float:
        started = time.perf_counter()
        num_tokens = sum(self.answer(messages, max_tokens)[1] for messages in prompts)
        return num_tokens / (time.perf_counter() - started)

    def expected(self, messages: list[dict], max_tokens: int) -> str:
        key = orjson.dumps(messages).decode()
        return self.answers[key] if key in self.answers else self.answer(messages, max_tokens)[0]


# -- profiles ---------------------------------------------------------------------------------------


def start_profile(server: Server, out: Path) -> subprocess.Popen:
    """py-spy on the server, Python frames only and without pausing it (`--nonblocking`): sampling
    native stacks stops every thread 50 times a second, which made c=1 rows 2.3 times slower (20.0
    tokens/s unprofiled, 8.6 profiled, one after the other on one server). Profiled rows are not timed."""
    pyspy = Path(sys.executable).with_name("py-spy")
    argv = [str(pyspy), "record", "--pid", str(server.process.pid), "--threads", "--nonblocking", "--rate", "100"]
    argv += ["--format", "raw", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profile(profiler: subprocess.Popen) -> None:
    profiler.send_signal(signal.SIGINT)
    profiler.wait(timeout=60)


def summarize_profile(path: Path, top: int = 12) -> str:
    """Busy samples per thread (py-spy leaves out threads waiting on a lock or I/O), and the Python
    lines where the busiest thread spends its time (self time: a line that calls into torch's C++
    holds the time of that call)."""
    by_thread: collections.Counter[str] = collections.Counter()
    by_leaf: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].partition(": ")[2] or frames[0]
        total += count
        by_thread[thread] += count
        leaf = frames[-1].replace(str(ROOT) + "/", "").split("site-packages/")[-1]
        by_leaf[thread][leaf] += count
    if not total:
        return "no samples"
    busiest, num_busiest = by_thread.most_common(1)[0]
    lines = [f"{total} busy samples (100/s per thread)", "", "by thread:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in by_thread.most_common(6)]
    lines += ["", f"{busiest}, self time by line:"]
    lines += [f"  {n / num_busiest:6.1%}  {name}" for name, n in by_leaf[busiest].most_common(top)]
    return "\n".join(lines)


# -- the run ----------------------------------------------------------------------------------------


@dataclass
class Tally:
    rates: dict[tuple[str, str], list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    ttfts: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: collections.defaultdict(list))
    num_same: collections.Counter[str] = field(default_factory=collections.Counter)
    num_checked: collections.Counter[str] = field(default_factory=collections.Counter)
    first_difference: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, got: list[str], want: list[str]) -> None:
        for a, b in zip(got, want, strict=True):
            self.num_checked[name] += 1
            if a == b:
                self.num_same[name] += 1
            else:
                self.first_difference.setdefault(name, f"served {a[:60]!r} / plain {b[:60]!r}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="also run the server of this commit (a git archive of it)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=4, help="requests per concurrency-1 row")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--prefix-requests", type=int, default=6)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "switchyard")
    parser.add_argument("--profile", action="store_true", help="then py-spy each server at c=1, c=32 (untimed)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"served-engine-{os.getpid()}"
    logs.mkdir(parents=True)
    trees = {"after": ROOT} if not args.before else {"before": archive(args.before, logs), "after": ROOT}
    servers = {name: start_default_server(name, tree, logs, args.cache_dir) for name, tree in trees.items()}
    try:
        for server in servers.values():  # one at a time: the first start converts the weights
            await wait_ready(server, timeout_s=600, model=MODEL)
            await wait_ready(server, timeout_s=600, model="local-large")
        plain = Plain(args.cache_dir)
        tally = Tally()
        n, c, new = args.requests, args.concurrency, args.new_tokens
        free, copy = free_prompts(max(n, c)), copy_prompts(n)
        profiles: dict[tuple[str, str], Path] = {}
        for server in servers.values():  # warm-up: each path once
            await served_rate(server, free[:1], 1, 4)
            await served_rate(server, free[:2], 2, 4)
        plain.rate(free[:1], 4)
        for round_index in range(args.rounds):
            print(f"round {round_index + 1} …", file=sys.stderr)
            tally.rates["plain generate", "free writing, c=1"].append(plain.rate(free[:n], new))
            tally.rates["plain generate", "copy-heavy, c=1"].append(plain.rate(copy, new))
            prefixed = prefix_prompts(plain.tokenizer, args.prefix_requests, args.prefix_tokens, f"p{round_index}")
            for name, server in servers.items():
                rate, answers = await served_rate(server, free[:n], 1, new)
                tally.rates[name, "free writing, c=1"].append(rate)
                tally.check(name, answers, [plain.expected(m, new) for m in free[:n]])
                rate, answers = await served_rate(server, copy, 1, new)
                tally.rates[name, "copy-heavy, c=1"].append(rate)
                tally.check(name, answers, [plain.expected(m, new) for m in copy])
                rate, answers = await served_rate(server, free[:c], c, new)
                tally.rates[name, f"free writing, c={c}"].append(rate)
                tally.check(name, answers[:n], [plain.expected(m, new) for m in free[:n]])  # the ones plain ran
                tally.ttfts[name].append(await served_ttft(server, prefixed))
                print(f"  {name}: done", file=sys.stderr)
        if args.profile:  # after the timed rounds: a profiled row is not a measurement
            for name, server in servers.items():
                for label, concurrency in (("c=1", 1), (f"c={c}", c)):
                    profiles[name, label] = logs / f"{name}-{label}.pyspy.txt"
                    profiler = start_profile(server, profiles[name, label])
                    await asyncio.sleep(1.0)  # py-spy attaches
                    await served_rate(server, free[: max(n, concurrency)], concurrency, new)
                    stop_profile(profiler)
    finally:
        for server in servers.values():
            server.stop()

    section = report(args, tally, servers, profiles)
    print(section)
    if not args.no_write:
        write_section("served-engine", section)


def report(args, tally: Tally, servers: dict[str, Server], profiles: dict[tuple[str, str], Path]) -> str:
    load = os.getloadavg()
    base = {w: statistics.median(r) for (who, w), r in tally.rates.items() if who == "plain generate"}
    lines = [
        f"## Embedded engine as served (`bench/served_engine.py`)\n\nRun {time.strftime('%Y-%m-%d %H:%M')} on "
        f"{platform.machine()}, {os.cpu_count()} cores, load average at the end {load[0]:.2f}; `switchyard serve` "
        f"with the built-in default config (local-small, local-large, local-embed, the auto classifier), "
        f"`{MODEL}` over HTTP, streamed, greedy, {args.new_tokens} new tokens; {args.rounds} interleaved rounds, "
        "medians. × plain: against plain transformers `generate` at batch 1 on the same converted weights, "
        f"in the same rounds.{' before: ' + args.before + '; after: this checkout.' if args.before else ''}\n",
        "| who | workload | tokens/s | × plain |",
        "| --- | --- | ---: | ---: |",
    ]
    workloads = list(dict.fromkeys(w for (_, w) in tally.rates))
    for who in ["plain generate", *servers]:
        for workload in workloads:
            rates = tally.rates.get((who, workload))
            if not rates:
                continue
            plain_rate = base.get(workload) or base["free writing, c=1"]
            rate = statistics.median(rates)
            lines.append(f"| {who} | {workload} | {rate:.1f} | {rate / plain_rate:.2f}× |")
    lines += [
        "",
        f"Shared system prompt: {args.prefix_requests} requests one after another, a ~{args.prefix_tokens}-token "
        "system prompt the same for all; time to first token.",
        "",
        "| who | first TTFT ms | later TTFT ms (p50) | later ÷ first |",
        "| --- | ---: | ---: | ---: |",
    ]
    for who, pairs in tally.ttfts.items():
        first = statistics.median(p[0] for p in pairs)
        later = statistics.median(p[1] for p in pairs)
        lines.append(f"| {who} | {first:.0f} | {later:.0f} | {later / first:.2f} |")
    lines += ["", "Greedy answers identical to plain `generate`'s:", ""]
    for who in servers:
        diff = f" (first difference: {tally.first_difference[who]})" if who in tally.first_difference else ""
        lines.append(f"- {who}: {tally.num_same[who]}/{tally.num_checked[who]}{diff}")
    for (who, label), path in profiles.items():
        lines += ["", f"py-spy, {who}, free writing at {label} (after the timed rounds):", ""]
        lines += ["```", summarize_profile(path), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    asyncio.run(main())
