"""An upstream that fails in phases under c=32: what do clients get, and how fast does it recover?

One fake OpenAI upstream ("flaky") goes through phases: healthy; killed (its port closed);
answering 500; hanging (accepts, never answers: the requests caught in it stay open until a
deadline ends them); answering 429 with `Retry-After`. After each fault (`--fault-s`) it is
healthy again until traffic recovers. Two `switchyard serve` processes with their
default resilience settings sit in front of it, side by side, each under its own c=32 closed-loop
load: one with no fallback, one whose model falls back to a second, healthy fake ("steady"). Half
of each load's clients stream, half ask for whole answers.

Per phase, proxy and kind (stream or whole): requests answered (200), failed (by status, or the
client error; a stream's in-band error after its 200), hung (no answer within `--hang-s`, 70 s),
and the recovery time: from the upstream being healthy again to the first success, and to the
first second in which 95% of the requests started succeed. Then, per proxy and kind, how many
requests stayed open longer than the deadline (the first-token budget, 45 s by default) + 5 s.

    make bench
    .venv/bin/python bench/faults.py --fault-s 10 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from overhead import (  # bench/ is on sys.path when run as a script
    Server,
    fake_model_yaml,
    free_port,
    start_fake_upstream,
    start_switchyard,
    wait_ready,
)
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 32
BODY = {"model": "flaky", "messages": [{"role": "user", "content": "Say fifty words."}]}
BODIES = {False: orjson.dumps(BODY), True: orjson.dumps(BODY | {"stream": True})}
KINDS = {False: "whole", True: "stream"}
DEADLINE_S = 45.0  # resilience.first_token_budget_s by default: no request waits longer for a first token
IN_BAND_ERROR = b'data: {"error"'
RETRY_AFTER_S = 5
RECOVERY_WINDOW_S = 1.0
FAULTS = ("killed", "500", "hang", "429")  # "killed": the port is closed; else the fake's failure mode


@dataclass
class Outcome:
    started_at: float
    ended_at: float
    result: str  # "200", another status and its error code, a client error's class, or "hung"
    is_stream: bool = False


@dataclass
class Phase:
    name: str
    began_at: float
    healed_at: float | None = None
    ended_at: float | None = None


@dataclass
class Load:
    name: str
    server: Server
    outcomes: list[Outcome] = field(default_factory=list)


class FlakyUpstream:
    """The fake upstream on one fixed port: killed and started again, or told to fail (at once, with
    no restart, through the fake's `POST /fake/behaviour`)."""

    def __init__(self, logs: Path) -> None:
        self.logs, self.port, self.server = logs, free_port(), None
        self.num_starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        self.num_starts += 1
        self.server = start_fake_upstream(self.logs, name=f"flaky-{self.num_starts}", port=self.port)
        await _wait_listening(self.port)
        await self.fail_with(None)

    def kill(self) -> None:
        if self.server is not None:
            self.server.process.kill()  # at once: the port closes, open connections drop
            self.server.process.wait()
            self.server = None

    async def fail_with(self, failure: str | None) -> None:
        behaviour = {"failure": failure, "retry_after_s": RETRY_AFTER_S}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{self.port}/fake/behaviour", json=behaviour) as response:
                response.raise_for_status()


async def _wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the fake upstream did not listen on {port} within {timeout_s:.0f} s")


async def run_load(load: Load, stop: asyncio.Event, hang_s: float) -> None:
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    timeout = aiohttp.ClientTimeout(total=hang_s)
    url = load.server.base_url + "/chat/completions"
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(is_stream: bool) -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    async with session.post(url, data=BODIES[is_stream], headers=headers) as response:
                        result = _result(response.status, await response.read())
                except TimeoutError:
                    result = "hung"
                except aiohttp.ClientError as exc:
                    result = type(exc).__name__
                load.outcomes.append(Outcome(started, time.monotonic(), result, is_stream))
                if result != "200":
                    await asyncio.sleep(0.05)  # a failing request answers at once; do not spin

        await asyncio.gather(*(worker(i % 2 == 1) for i in range(CONCURRENCY)))


async def wait_recovered(loads: list[Load], healed_at: float, limit_s: float) -> None:
    """Until every load has had a second with 95% successes started after the heal (or `limit_s`)."""
    num_before = [len(load.outcomes) for load in loads]
    while time.monotonic() - healed_at < limit_s:
        await asyncio.sleep(0.5)
        recovered = (_recovery_s(load.outcomes[n:], healed_at, 0.95) for load, n in zip(loads, num_before, strict=True))
        if all(seconds is not None for seconds in recovered):
            return


_CAUSES = (  # what the first attempt's description says, in the words of backends/openai_http.py
    ("circuit", "circuit open"),
    ("unreachable", "unreachable"),
    ("timed out", "timeout"),
    ("returned 429", "upstream 429"),
    ("returned 500", "upstream 500"),
)


def _result(status: int, body: bytes) -> str:
    """`200`, or the status, the error's code and its cause (`503 upstream_unavailable: circuit open`);
    a stream's in-band error as `200 in-band upstream_timeout: timeout`."""
    if status == 200:
        at = body.find(IN_BAND_ERROR)
        if at == -1:
            return "200"
        event = body[at + len(b"data: ") :].split(b"\n", 1)[0]
        return "200 in-band " + _result(0, event).removeprefix("0 ")
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return str(status)
    message = (error.get("message") or "").partition(";")[0]
    cause = next((label for words, label in _CAUSES if words in message), None)
    return f"{status} {error.get('code')}" + (f": {cause}" if cause else "")


def _recovery_s(outcomes: list[Outcome], healed_at: float, rate: float) -> float | None:
    """Seconds from the heal to the first request that starts a window of RECOVERY_WINDOW_S in which
    `rate` of the requests started (and finished) succeeded."""
    after = sorted((o for o in outcomes if o.started_at >= healed_at), key=lambda o: o.started_at)
    if not after or after[-1].started_at - after[0].started_at < RECOVERY_WINDOW_S:
        return None
    end = num_ok = 0
    for begin, first in enumerate(after):
        while end < len(after) and after[end].started_at < first.started_at + RECOVERY_WINDOW_S:
            num_ok += after[end].result == "200"
            end += 1
        if end == len(after):  # the window is not over yet
            return None
        if num_ok >= rate * (end - begin):
            return first.started_at - healed_at
        num_ok -= first.result == "200"
    return None


def _first_success_s(outcomes: list[Outcome], healed_at: float) -> float | None:
    ends = [o.ended_at for o in outcomes if o.result == "200" and o.started_at >= healed_at]
    return min(ends) - healed_at if ends else None


def _is_during(outcome: Outcome, phase: Phase) -> bool:
    """A fault's requests: those started before the heal that were still open when it began (so
    also those in flight at that moment); a healthy phase's: those over before the next began."""
    if phase.healed_at is None:
        return phase.began_at <= outcome.started_at and outcome.ended_at < phase.ended_at
    return outcome.started_at < phase.healed_at and outcome.ended_at >= phase.began_at


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def table(loads: list[Load], phases: list[Phase]) -> str:
    lines = [
        "| phase | proxy | kind | requests | answered 200 | failed (by status and code) | hung "
        "| recovery: first success s | recovery: 95% s |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for phase in phases:
        end = phase.healed_at if phase.healed_at is not None else phase.ended_at
        for load, is_stream in ((load, is_stream) for load in loads for is_stream in KINDS):
            outcomes = [o for o in load.outcomes if o.is_stream == is_stream]
            during = [o for o in outcomes if _is_during(o, phase)]
            results = Counter(o.result for o in during)
            failed = ", ".join(f"{n} × {r}" for r, n in results.most_common() if r not in ("200", "hung"))
            recovery = ("-", "-")
            if phase.healed_at is not None:
                recovery = (
                    _seconds(_first_success_s(outcomes, phase.healed_at)),
                    _seconds(_recovery_s(outcomes, phase.healed_at, 0.95)),
                )
            lines.append(
                f"| {phase.name} ({end - phase.began_at:.0f} s) | {load.name} | {KINDS[is_stream]} | {len(during)} "
                f"| {results['200']} | {failed or '-'} | {results['hung']} | {recovery[0]} | {recovery[1]} |"
            )
    return "\n".join(lines)


def open_too_long(loads: list[Load]) -> str:
    """Per proxy and kind, the requests open longer than the deadline + 5 s (the hung ones among them)."""
    lines = []
    for load in loads:
        for is_stream, kind in KINDS.items():
            durations = [o.ended_at - o.started_at for o in load.outcomes if o.is_stream == is_stream]
            num_long = sum(seconds > DEADLINE_S + 5 for seconds in durations)
            lines.append(f"- {load.name}, {kind}: open longer than the deadline + 5 s: {num_long}")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault-s", type=float, default=15.0, help="how long each fault lasts")
    parser.add_argument("--hang-s", type=float, default=70.0, help="a request with no answer by then is hung")
    parser.add_argument("--recovery-limit-s", type=float, default=45.0, help="longest wait for recovery")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="switchyard-bench-"))
    flaky = FlakyUpstream(logs)
    await flaky.start()
    steady = start_fake_upstream(logs, name="steady")
    flaky_server = Server("flaky", flaky.base_url)
    head = "server:\n  log_level: warning\nmodels:\n"
    proxies = {
        "no fallback": start_switchyard(logs, "switchyard-alone", head + fake_model_yaml("flaky", flaky_server)),
        "fallback": start_switchyard(
            logs,
            "switchyard-fallback",
            head
            + fake_model_yaml("flaky", flaky_server, "    fallbacks: [steady]\n")
            + fake_model_yaml("steady", steady),
        ),
    }
    loads = [Load(name, server) for name, server in proxies.items()]
    phases: list[Phase] = []
    stop = asyncio.Event()
    try:
        for server in proxies.values():
            await wait_ready(server, model="flaky")
        runners = [asyncio.create_task(run_load(load, stop, args.hang_s)) for load in loads]
        phases.append(Phase("healthy", time.monotonic()))
        await asyncio.sleep(5)
        for name in FAULTS:
            print(f"{name} …", file=sys.stderr, flush=True)
            phase = Phase(name, time.monotonic())
            phases[-1].ended_at = phase.began_at
            phases.append(phase)
            if name == "killed":
                flaky.kill()
            else:
                await flaky.fail_with(name)
            await asyncio.sleep(args.fault_s)
            if name == "killed":
                await flaky.start()
            else:
                await flaky.fail_with(None)
            phase.healed_at = time.monotonic()
            # requests caught in the hang stay open (the fake never answers them) until a deadline
            limit_s = args.recovery_limit_s + (args.hang_s if name == "hang" else 0)
            await wait_recovered(loads, phase.healed_at, limit_s)
        phases[-1].ended_at = time.monotonic()
        stop.set()
        await asyncio.gather(*runners)
    finally:
        stop.set()
        for server in [*proxies.values(), steady]:
            server.stop()
        flaky.kill()

    section = (
        "## Upstream faults under load (`bench/faults.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: `.venv/bin/python bench/faults.py --fault-s {args.fault_s:g} "
        f"--hang-s {args.hang_s:g}`. Two `switchyard serve` with default resilience settings, each "
        f"under c={CONCURRENCY} closed-loop traffic (half the clients streaming), in front of one fake upstream "
        "that fails "
        f"in phases of {args.fault_s:g} s (killed: port closed; 500; hang: accepts, never answers, also "
        f"after the heal; 429 with `Retry-After: {RETRY_AFTER_S}`), then is healthy again until traffic "
        f'recovers. "fallback": the model falls back to a second, healthy fake. A fault\'s requests are '
        f"those started before the heal and still open when it began; hung: no answer within "
        f"{args.hang_s:g} s; recovery: from the heal to the first success, and to the first "
        f"{RECOVERY_WINDOW_S:g} s window in which "
        f"95% of the requests started succeeded.\n\n{table(loads, phases)}\n\n"
        f"Requests open longer than the deadline (the first-token budget, {DEADLINE_S:g} s) + 5 s, "
        f"over the whole run:\n\n{open_too_long(loads)}\n"
    )
    print(section)
    if not args.no_write:
        write_section("faults", section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
