"""The learning loop end to end, through the served process: shadow rows accrue, the traffic
shifts, drift is flagged, `switchyard eval retune` writes thresholds that recover the quality at a
lower cost on the new mix, a rollout shows it on live traffic, and the candidate is promoted.

Two chat models on a scripted fake upstream (bench/learning_world.py): multiple-choice questions
first (the weak model right three times in four, and unsure when wrong), then word problems (the
weak model wrong more often than not, fluent when wrong, with one unsure number). `switchyard
serve --config` as a user runs it, every `auto` and `cascade` request shadowed. Beside it, a second
proxy with shadowing off answers the same rounds, one proxy at a time, for the client latency.

    .venv/bin/python bench/learning.py               # writes the `learning` section of bench/RESULTS.md
    .venv/bin/python bench/learning.py --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from learning_world import STRONG, WEAK, Item, world_items  # noqa: E402
from overhead import Server, free_port, start  # noqa: E402
from results import write_section  # noqa: E402

from switchyard.backends.defaults import DEFAULT_THRESHOLDS  # noqa: E402
from switchyard.classifier.model import DEFAULT_ARTIFACT  # noqa: E402
from switchyard.learning.graders import choice_of, final_number  # noqa: E402

ADMIN, KEY, WARM_UP_KEY = "admin-learning-bench", "sk-learning-bench", "sk-learning-warm-up"
PRICES = {WEAK: (0.5, 1.5), STRONG: (5.0, 15.0)}  # USD per million input, output tokens
ROUTES = ("auto", "cascade")
CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class Reply:
    route: str
    kind: str
    is_right: bool
    model: str
    cost_usd: float
    latency_s: float
    version: str | None


def config(
    folder: Path, name: str, upstream: str, *, shadow_rate: float, budget: float = 5.0, extra: dict | None = None
) -> Path:
    models = [
        {
            "name": model,
            "backend": "openai",
            "base_url": upstream + "/v1",
            "api_key": "unused",
            "tier": tier,
            "price": {"input_usd_per_mtok": PRICES[model][0], "output_usd_per_mtok": PRICES[model][1]},
        }
        for model, tier in ((WEAK, "small"), (STRONG, "large"))
    ]
    body = {
        "server": {"log_level": "warning"},
        "models": models,
        "routing": {
            "thresholds_file": str(folder / "thresholds.yaml"),
            "auto": {"tiers": ["small", "large"], "classifier_artifact": str(folder / "classifier")},
        },
        "rollout": {
            "candidate": str(folder / "candidate.yaml"),
            "candidate_artifact": str(folder / "candidate-classifier"),
            "share": 0.5,
        },
        "cascade": {"ladder": [WEAK, STRONG]},
        "billing": {"ledger_path": str(folder / f"{name}.sqlite3"), "redis_url": "none"},
        "auth": {"admin_key": ADMIN},
        "teams": {"bench": {"api_keys": [KEY]}, "warm-up": {"api_keys": [WARM_UP_KEY]}},
        "logging": {"requests": False},
        "drift": {"window": 100, "min_samples": 50},
        "shadow": {"rate": shadow_rate, "budget_usd_per_day": budget, "target": "other_tier", "teams": ["bench"]},
        **(extra or {}),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def serve(path: Path, name: str, logs: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "switchyard", "serve", "--config", str(path), "--port", str(port)]
    return start(name, argv, port, logs)


async def wait_ready(server: Server, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    url = server.base_url.removesuffix("/v1") + "/health/ready"
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if server.process is not None and server.process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.process.returncode}; see its log")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{server.name} was not ready within {timeout_s:.0f} s")


async def ask(session: aiohttp.ClientSession, server: Server, item: Item, route: str) -> Reply:
    body = {"model": route, "messages": [{"role": "user", "content": item.prompt}], "temperature": 0}
    started = time.perf_counter()
    async with session.post(server.base_url + "/chat/completions", json=body) as response:
        answer = await response.json()
        latency = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{server.name}: {response.status} {answer}")
        version = response.headers.get("x-switchyard-routing-version")
    text = answer["choices"][0]["message"]["content"] or ""
    given = choice_of(text) if item.kind == "choice" else final_number(text)
    usage, model = answer["usage"], answer["model"]
    price = PRICES.get(model, (0.0, 0.0))
    cost = (usage["prompt_tokens"] * price[0] + usage["completion_tokens"] * price[1]) / 1e6
    return Reply(route, item.kind, given == item.truth, model, cost, latency, version)


async def traffic(server: Server, items: list[Item], key: str = KEY) -> list[Reply]:
    """Every item to `auto` and to `cascade`, CONCURRENCY at a time."""
    work = [(item, route) for item in items for route in ROUTES]
    replies: list[Reply] = []
    headers = {"authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def worker() -> None:
            while work:
                item, route = work.pop(0)
                replies.append(await ask(session, server, item, route))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return replies


_SCRAPED = r"(switchyard_(?:shadow_requests_total|drift_psi|drift_rate|cascade_thrash_trips_total)\{[^}]*\}) (\S+)"


async def scrape(server: Server) -> dict[str, float]:
    """The /metrics samples this bench reads: shadow outcomes and drift."""
    url = server.base_url.removesuffix("/v1") + "/metrics"
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers={"authorization": f"Bearer {ADMIN}"}) as response:
            text = await response.text()
    found = {}
    for line in text.splitlines():
        match = re.match(_SCRAPED, line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def shadow(samples: dict[str, float], outcome: str) -> float:
    return samples.get(f'switchyard_shadow_requests_total{{outcome="{outcome}"}}', 0.0)


async def shadow_idle(server: Server, timeout_s: float = 600.0) -> dict[str, float]:
    """Once every sampled request's job has ended (its outcome counted)."""
    deadline = time.monotonic() + timeout_s
    ended = ("dropped", "over_budget", "skipped", "failed", "labelled", "unlabelled")
    while time.monotonic() < deadline:
        samples = await scrape(server)
        finished = sum(shadow(samples, outcome) for outcome in ended) + (
            shadow(samples, "completed") - shadow(samples, "labelled") - shadow(samples, "unlabelled")
        )
        if finished >= shadow(samples, "sampled"):
            return samples
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{server.name}: shadow jobs still running after {timeout_s:.0f} s")


def summary(replies: list[Reply], route: str) -> dict[str, float]:
    rows = [r for r in replies if r.route == route]
    if not rows:
        return {}
    return {
        "quality": sum(r.is_right for r in rows) / len(rows),
        "cost_per_1k": 1000 * sum(r.cost_usd for r in rows) / len(rows),
        "strong_share": sum(r.model == STRONG for r in rows) / len(rows),
        "n": len(rows),
    }


def psi(samples: dict[str, float], signal: str) -> float:
    return samples.get(f'switchyard_drift_psi{{signal="{signal}"}}', float("nan"))


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")} | {"COLUMNS": "120"}


def retune(path: Path, out: Path, plot: Path) -> tuple[int, str]:
    argv = [sys.executable, "-m", "switchyard", "eval", "retune", "--config", str(path), "--since", "1d"]
    argv += ["--out", str(out), "--plot", str(plot)]
    done = subprocess.run(argv, capture_output=True, text=True, env=_plain_env(), cwd=ROOT)
    return done.returncode, done.stdout + done.stderr


def promote(path: Path, server: Server) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "switchyard", "rollout", "promote", "--config", str(path)]
    argv += ["--url", server.base_url.removesuffix("/v1"), "--admin-key", ADMIN]
    return subprocess.run(argv, capture_output=True, text=True, env=_plain_env(), cwd=ROOT)


async def admin(server: Server, method: str, path: str) -> dict:
    url = server.base_url.removesuffix("/v1") + path
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, headers={"authorization": f"Bearer {ADMIN}"}) as response:
            body = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{method} {path}: {response.status} {body}")
            return body


def latency_ratio(on: list[Reply], off: list[Reply]) -> tuple[float, float]:
    def quantile(replies: list[Reply], q: float) -> float:
        return statistics.quantiles([r.latency_s for r in replies], n=100)[int(q * 100) - 1]

    for name, replies in (("on", on), ("off", off)):
        cuts = [quantile(replies, q) * 1000 for q in (0.5, 0.9, 0.95, 0.99)]
        shown = " / ".join(f"{c:.1f}" for c in cuts)
        print(f"latency shadow {name}: p50/p90/p95/p99 {shown} ms", file=sys.stderr)
    return quantile(on, 0.5) / quantile(off, 0.5), quantile(on, 0.95) / quantile(off, 0.95)


async def main(args) -> str:
    folder = Path(tempfile.mkdtemp(prefix="switchyard-learning-"))
    items = world_items(args.n)
    choice, word = items[: args.n], items[args.n :]
    shutil.copyfile(DEFAULT_THRESHOLDS, folder / "thresholds.yaml")
    shutil.copytree(DEFAULT_ARTIFACT, folder / "classifier")
    lines = []
    port = free_port()
    world = start("world", [sys.executable, str(BENCH / "learning_world.py"), str(port), str(args.n)], port, folder)
    upstream = f"http://127.0.0.1:{port}"
    try:
        on_path = config(folder, "shadow-on", upstream, shadow_rate=args.shadow_rate, budget=args.shadow_budget)
        off_path = config(folder, "shadow-off", upstream, shadow_rate=0.0)
        on, off = serve(on_path, "shadow-on", folder), serve(off_path, "shadow-off", folder)
        try:
            await wait_ready(on)
            await wait_ready(off)
            # a first pass through each proxy (its first requests pay for lazy set-up), not shadowed
            warm_up = [Item(f"Warm-up question {i}: is this a test?", "choice", "A", True) for i in range(20)]
            for server in (on, off):
                await traffic(server, warm_up, WARM_UP_KEY)
            phases: dict[str, list[Reply]] = {}
            latency_on: list[Reply] = []
            latency_off: list[Reply] = []
            during = done = 0.0  # shadow jobs labelled while a round ran, and in all
            for phase, items in (("multiple choice", choice), ("word problems", word[: args.n])):
                print(f"{phase}: {len(items)} prompts x {len(ROUTES)} routes …", file=sys.stderr, flush=True)
                replies = []
                for start_at in range(0, len(items), 40):  # rounds, one proxy at a time, in turn first
                    chunk = items[start_at : start_at + 40]
                    if start_at % 80:
                        latency_off += await traffic(off, chunk)
                    replies += await traffic(on, chunk)
                    during += shadow(await scrape(on), "labelled") - done
                    done = shadow(await shadow_idle(on), "labelled")
                    if not start_at % 80:
                        latency_off += await traffic(off, chunk)
                phases[phase] = replies
                latency_on += replies
            drifted = await shadow_idle(on)
            off.stop()
            plot = BENCH / "curves" / "learning-retune.png"
            code, output = await asyncio.to_thread(retune, on_path, folder / "candidate.yaml", plot)
            print(output, file=sys.stderr)
            if code != 0:
                raise RuntimeError(f"eval retune exited {code}")
            print(f"rollout: {await admin(on, 'POST', '/admin/reload')}", file=sys.stderr, flush=True)
            phases["rollout (half each)"] = await traffic(on, word[args.n : 2 * args.n])
            await shadow_idle(on)
            promoted = await asyncio.to_thread(promote, on_path, on)
            print(promoted.stdout + promoted.stderr, file=sys.stderr)
            if promoted.returncode != 0:
                raise RuntimeError(f"rollout promote exited {promoted.returncode}")
            phases["promoted"] = await traffic(on, word[2 * args.n : 3 * args.n])
            after = await shadow_idle(on)
            lines += report(phases, drifted, after, latency_ratio(latency_on, latency_off), during, code, output)
        finally:
            on.stop()
            off.stop()
    finally:
        world.stop()
    print(f"logs and configs: {folder}", file=sys.stderr)
    return "\n".join(lines)


def report(phases, drifted, after, latency, during: float, code: int, output: str) -> list[str]:
    lines = [
        "## The learning loop, through the served process (`bench/learning.py`)",
        "",
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores. Two models on a scripted fake upstream"
        " (bench/learning_world.py): multiple-choice questions, then word problems the weak model gets"
        " wrong, sure of itself, when they are two-step; `switchyard serve --config`, every auto and"
        " cascade request shadowed (`shadow.rate: 1`); quality is the share of answers right.",
        "",
        "| phase | route | routing version | requests | quality | USD per 1k requests | strong share |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for phase, replies in phases.items():
        for route in ROUTES:
            for version in sorted({r.version or "-" for r in replies if r.route == route}):
                s = summary([r for r in replies if (r.version or "-") == version], route)
                lines.append(
                    f"| {phase} | {route} | {version} | {s['n']} | {s['quality']:.3f} | {s['cost_per_1k']:.4f}"
                    f" | {s['strong_share']:.2f} |"
                )
    lines += [
        "",
        f"Drift after the shift (`switchyard_drift_psi`, the alert at 0.2): classifier_score"
        f" {psi(drifted, 'classifier_score'):.2f}, cascade_confidence {psi(drifted, 'cascade_confidence'):.2f};"
        f" after the promotion, against the new version's reference: {psi(after, 'classifier_score'):.2f} and"
        f" {psi(after, 'cascade_confidence'):.2f}.",
        f"Cascade thrash-guard trips: {sum(v for k, v in after.items() if 'thrash_trips' in k):.0f}."
        f" Shadow jobs: {shadow(after, 'sampled'):.0f} sampled, {shadow(after, 'labelled'):.0f} labelled,"
        f" {shadow(after, 'over_budget'):.0f} over budget, {shadow(after, 'dropped'):.0f} dropped (the rollout and"
        " promotion phases run without a pause: jobs past `shadow.max_pending` are dropped, as in a proxy that is"
        " never idle).",
        "",
        f"Client latency of the shadowed proxy against one with shadowing off, the same rounds of the first two"
        f" phases, one proxy at a time: p50 {latency[0]:.2f}x, p95 {latency[1]:.2f}x. Shadow calls wait for an"
        f" idle proxy: {during:.0f} of the jobs ended while a round was running, the rest after it. Both ratios"
        " move by about 0.2 between runs on this machine (`--shadow-rate 0` runs the same comparison with"
        " neither proxy shadowing).",
        "",
        f"`switchyard eval retune --config … --since 1d` exited {code}:",
        "",
        "```",
        *output.strip().splitlines(),
        "```",
    ]
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="prompts per phase (default 200)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write bench/RESULTS.md")
    parser.add_argument("--shadow-rate", type=float, default=1.0, help="of the shadowed proxy (0: an A/A check)")
    parser.add_argument("--shadow-budget", type=float, default=5.0, help="USD per day (0: every job over budget)")
    args = parser.parse_args()
    section = asyncio.run(main(args))
    print(section)
    if not args.no_write:
        write_section("learning", section)
