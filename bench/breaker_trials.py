"""How many calls does a circuit breaker let through when it half-opens? aiobreaker against ours.

aiobreaker's `CircuitBreaker` (what Switchyard used until the 2026-11-22 release) and Switchyard's
`Breaker` (switchyard/backends/breaker.py), with the same settings: `--fail-max` upstream failures
in a row open them, `--reset-s` later they half-open. Each is opened, its reset waited out, and then
`--calls` concurrent calls arrive; a call that gets through waits at the upstream until all of them
have been submitted (an upstream slow to answer, as a sick one is), then the upstream answers: still
failing (503), or recovered. Counted: the calls that reached the upstream in half-open, the calls
refused without reaching it, and the breaker's state afterwards.

A second table gives what one trial's outcome does to each breaker: a success, a 503, the
upstream's 429, a client's 400, and a trial whose caller went away (cancelled). Both breakers count
the same errors as failures (`is_breaker_failure`; aiobreaker through its `exclude` list).

    make bench
    .venv/bin/python bench/breaker_trials.py --calls 200 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path

from results import RESULTS, write_section  # bench/ is on sys.path when run as a script

from switchyard.backends.breaker import Breaker, BreakerPolicy, is_breaker_failure
from switchyard.core.errors import BackendError, BackendRateLimited, BackendRejected, BackendUnavailable, CircuitOpen

try:
    from aiobreaker import CircuitBreaker, CircuitBreakerError
except ImportError:
    sys.exit("bench/breaker_trials.py needs aiobreaker: run `make bench`, or pip install -e '.[bench]'")

ROOT = Path(__file__).resolve().parent.parent
REFUSALS = (CircuitBreakerError, CircuitOpen)


class Upstream:
    """Counts the calls that reach it; each waits for `release`, then gets `outcome` (None: an answer)."""

    def __init__(self, outcome: BaseException | None) -> None:
        self.outcome = outcome
        self.release = asyncio.Event()
        self.num_calls = 0

    async def call(self) -> str:
        self.num_calls += 1
        await self.release.wait()
        if self.outcome is not None:
            raise self.outcome
        return "ok"


class Subject(ABC):
    """One breaker under test: how to call through it, and how to read its state."""

    name: str

    def __init__(self, fail_max: int, reset_s: float) -> None:
        self.fail_max, self.reset_s = fail_max, reset_s

    @abstractmethod
    async def call(self, upstream: Callable[[], Awaitable[str]]) -> str: ...

    @abstractmethod
    def state(self) -> str: ...

    async def open(self) -> None:
        """`fail_max` failures in a row, then the reset waited out."""
        for _ in range(self.fail_max):
            upstream = Upstream(BackendUnavailable("upstream 503"))
            upstream.release.set()
            try:
                await self.call(upstream.call)
            except (BackendError, *REFUSALS):
                pass
        assert self.state() == "open", self.state()
        # aiobreaker reads the wall clock (`datetime.utcnow()`) and cannot be given another one
        await asyncio.sleep(self.reset_s * 1.25)


class AioBreaker(Subject):
    name = "aiobreaker 1.2 `CircuitBreaker`"

    def __init__(self, fail_max: int, reset_s: float) -> None:
        super().__init__(fail_max, reset_s)
        self.breaker = CircuitBreaker(
            fail_max=fail_max,
            timeout_duration=dt.timedelta(seconds=reset_s),
            exclude=[lambda exc: not is_breaker_failure(exc)],
        )

    async def call(self, upstream: Callable[[], Awaitable[str]]) -> str:
        return await self.breaker.call_async(upstream)

    def state(self) -> str:
        # its state changes only when a call arrives: "open" until the first call after the reset
        return self.breaker.current_state.name.lower().replace("_", "-")


class OurBreaker(Subject):
    name = "Switchyard `Breaker`"

    def __init__(self, fail_max: int, reset_s: float) -> None:
        super().__init__(fail_max, reset_s)
        self.breaker = Breaker(BreakerPolicy(fail_max=fail_max, reset_s=reset_s))

    async def call(self, upstream: Callable[[], Awaitable[str]]) -> str:
        """As the resilient executor calls through it: a ticket, settled with the outcome."""
        ticket = self.breaker.admit()
        if ticket is None:
            raise CircuitOpen(self.breaker.refusal() or "refused")
        try:
            answer = await upstream()
        except BaseException as exc:
            ticket.settle(exc)
            raise
        ticket.settle(None)
        return answer

    def state(self) -> str:
        cooldown_s = self.breaker.cooldown_left_s()
        return self.breaker.state + (f", cooling down {cooldown_s:.1f} s" if cooldown_s > 0 else "")


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the calls were not all submitted")
        await asyncio.sleep(0)


async def burst(subject: Subject, num_calls: int, outcome: BaseException | None) -> int:
    """`num_calls` calls at once; returns how many reached the upstream."""
    upstream = Upstream(outcome)
    calls = [asyncio.create_task(subject.call(upstream.call)) for _ in range(num_calls)]
    # every call has either reached the upstream (and waits there) or been refused
    await until(lambda: upstream.num_calls + sum(c.done() for c in calls) == num_calls)
    upstream.release.set()
    await asyncio.gather(*calls, return_exceptions=True)
    return upstream.num_calls


async def half_open_burst(subject: Subject, num_calls: int, outcome: BaseException | None) -> list[str]:
    await subject.open()
    num_through = await burst(subject, num_calls, outcome)
    return [subject.name, str(num_calls), str(num_through), str(num_calls - num_through), subject.state()]


TRIAL_OUTCOMES: list[tuple[str, Callable[[], BaseException | None]]] = [
    ("an answer", lambda: None),
    ("503", lambda: BackendUnavailable("upstream 503")),
    ("the upstream's 429 (`Retry-After: 1`)", lambda: BackendRateLimited("upstream 429", retry_after_s=1)),
    ("a client's 400", lambda: BackendRejected("bad request", status_code=400)),
    ("cancelled (its client left)", lambda: None),
]


async def one_trial(subject: Subject, label: str, outcome: BaseException | None, num_calls: int) -> list[str]:
    """One call in half-open, ending with `outcome`; then the state, and how many of `num_calls`
    calls that come at once right after reach the (now healthy) upstream."""
    await subject.open()
    upstream = Upstream(outcome)
    call = asyncio.create_task(subject.call(upstream.call))
    await until(lambda: upstream.num_calls == 1)
    if label.startswith("cancelled"):
        call.cancel()
    upstream.release.set()
    await asyncio.gather(call, return_exceptions=True)
    state = subject.state()
    return [state, str(await burst(subject, num_calls, None))]


def markdown(headers: list[str], align: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--fail-max", type=int, default=5)
    parser.add_argument("--reset-s", type=float, default=0.2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    subjects: list[Callable[[], Subject]] = [
        lambda: AioBreaker(args.fail_max, args.reset_s),
        lambda: OurBreaker(args.fail_max, args.reset_s),
    ]
    burst_rows = []
    for label, outcome in [("still failing (503)", BackendUnavailable("upstream 503")), ("recovered", None)]:
        for make in subjects:
            burst_rows.append([label, *await half_open_burst(make(), args.calls, outcome)])
    trial_rows = []
    for label, make_outcome in TRIAL_OUTCOMES:
        row = [label]
        for make in subjects:
            row += await one_trial(make(), label, make_outcome(), args.calls)
        trial_rows.append(row)

    n = args.calls
    burst_table = markdown(
        ["upstream when the calls end", "breaker", "calls in half-open", "reached the upstream", "refused", "after"],
        ["---", "---", "---:", "---:", "---:", "---"],
        burst_rows,
    )
    trial_table = markdown(
        [
            "the one trial's outcome",
            "aiobreaker: state after",
            f"aiobreaker: of {n} calls next, reached the upstream",
            "Switchyard: state after",
            f"Switchyard: of {n} calls next, reached the upstream",
        ],
        ["---", "---", "---:", "---", "---:"],
        trial_rows,
    )
    section = (
        "## Breaker trials in half-open (`bench/breaker_trials.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}: `.venv/bin/python bench/breaker_trials.py --calls {args.calls} "
        f"--fail-max {args.fail_max} --reset-s {args.reset_s:g}`. Each breaker is opened by "
        f"{args.fail_max} upstream 503s, its {args.reset_s:g} s reset waited out, then {args.calls} calls "
        "arrive at once; those let through wait at the upstream until every call has been submitted, "
        "then the upstream answers. aiobreaker's state changes only when a call arrives (it reads "
        "`open` until then).\n\n"
        f"{burst_table}\n\n"
        "What the outcome of one call in half-open does to each breaker, and how many of "
        f"{args.calls} calls that come at once right after it reach the upstream (healthy by then, "
        "and again slow to answer). Both count only `is_breaker_failure` errors as failures; "
        "aiobreaker takes every other outcome it sees for a success, and does not see a "
        "cancellation.\n\n"
        f"{trial_table}\n"
    )
    print(section)
    if not args.no_write:
        write_section("breaker-trials", section)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
