import asyncio

import pytest

from switchyard.backends.breaker import AttemptTickets, Breaker, BreakerPolicy, SettlingStream
from switchyard.backends.deadlines import DeadlineStream
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import BackendError, BackendRateLimited, BackendRejected, BackendTimeout, CircuitOpen
from switchyard.core.request_context import Deadline


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: Clock, **policy) -> Breaker:
    return Breaker(BreakerPolicy(**{"fail_max": 2, "reset_s": 10.0, **policy}), clock)


def _fail(breaker: Breaker, error: BaseException) -> None:
    ticket = breaker.admit()
    assert ticket is not None
    ticket.settle(error)


def test_failures_in_a_row_open_it_and_half_open_admits_one_trial():
    clock = Clock()
    breaker = _breaker(clock)
    _fail(breaker, BackendError("500"))
    breaker.admit().settle(None)  # a success in between: the count starts over
    _fail(breaker, BackendTimeout("slow"))
    assert breaker.state == "closed"
    _fail(breaker, BackendError("500"))
    assert breaker.state == "open" and breaker.admit() is None
    clock.now += 10
    trial = breaker.admit()
    assert breaker.state == "half-open" and trial is not None and trial.is_trial
    assert breaker.admit() is None  # one trial at a time
    clock.now += 10
    lost = breaker.admit()  # a trial never settled does not keep it shut for good
    assert lost is not None and lost.is_trial and breaker.admit() is None
    lost.settle(asyncio.CancelledError())
    trial.settle(asyncio.CancelledError())  # the caller left: nothing learnt, the next may try
    trial = breaker.admit()
    trial.settle(BackendError("still broken"))
    assert breaker.state == "open"
    clock.now += 10
    breaker.admit().settle(None)
    assert breaker.state == "closed" and breaker.num_failures == 0


def test_client_errors_rate_limits_and_our_refusals_never_count():
    clock = Clock()
    breaker = _breaker(clock, fail_max=1)
    for error in (BackendRejected("bad", status_code=400), CircuitOpen("open"), asyncio.CancelledError()):
        _fail(breaker, error)
    assert breaker.state == "closed"
    _fail(breaker, BackendRateLimited("slow down", retry_after_s=3))
    assert breaker.state == "closed" and breaker.refusal() == "cooling down after a 429"
    assert breaker.admit() is None and breaker.cooldown_left_s() == 3
    assert breaker.admit(ignore_cooldown=True) is not None  # the one who waited the Retry-After out
    clock.now += 3
    assert breaker.refusal() is None


def test_a_cooldown_is_capped_and_has_a_default():
    clock = Clock()
    breaker = _breaker(clock, max_cooldown_s=60, default_cooldown_s=1)
    _fail(breaker, BackendRateLimited("no Retry-After"))
    assert breaker.cooldown_left_s() == 1
    clock.now += 1
    _fail(breaker, BackendRateLimited("come back tomorrow", retry_after_s=86400))
    assert breaker.cooldown_left_s() == 60


async def _chunks(error: BaseException | None):
    yield StreamChunk(b'{"choices":[]}')
    if error is not None:
        raise error


def _far_deadline(chunks, tickets):
    """The stream with a deadline it never reaches: the deadline's wrapper settles the tickets itself."""
    return DeadlineStream(chunks, Deadline(asyncio.get_running_loop().time() + 3600, "never"), "m", tickets)


@pytest.mark.parametrize("wrap", [SettlingStream, _far_deadline], ids=["settling", "deadline"])
async def test_a_stream_settles_when_it_ends_however_it_ends(wrap):
    clock = Clock()
    for error, expected_failures in ((None, 0), (BackendError("dropped"), 1)):
        breaker = _breaker(clock, fail_max=5)
        tickets = AttemptTickets([breaker.admit()])
        stream = wrap(_chunks(error), tickets)
        try:
            [chunk async for chunk in stream]
        except BackendError:
            pass
        assert breaker.num_failures == expected_failures and tickets.tickets[0].is_settled
    breaker = _breaker(clock, fail_max=1)
    clock.now += 1
    tickets = AttemptTickets([breaker.admit()])
    stream = wrap(_chunks(BackendError("never read")), tickets)
    await anext(stream)
    await stream.aclose()  # the reader left mid-way
    assert breaker.state == "closed" and tickets.tickets[0].is_settled


def test_a_parameter_refused_before_the_call_says_nothing_about_the_upstream():
    """Neither a failure nor an answer: it does not reset a run of failures either."""
    from switchyard.core.errors import UnsupportedParameter

    breaker = _breaker(Clock(), fail_max=2)
    _fail(breaker, BackendError("500"))
    _fail(breaker, UnsupportedParameter("Model 'x' does not support logprobs (logprobs).", param="logprobs"))
    assert breaker.num_failures == 1
    _fail(breaker, BackendError("500"))
    assert breaker.state == "open"
