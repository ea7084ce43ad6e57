"""A hung upstream in every phase of a call, streamed and not, one client and 32 at once: every
request ends by its deadlines, none stays open.

The phases: the TCP connect never completes (a listener whose accept queue is full drops the
SYN), the status line never comes, the headers come and no event, a few events come and then
nothing. The first-token timeout guards the first three, for streams and for whole answers, which
are asked as streams by default (`assemble_from_stream`, left out or true); a plain whole answer
(`assemble_from_stream: false`) has no first token and is bounded by the request's deadline; a
started stream by the stream idle timeout. The clients' own timeout (`HANG_GUARD_S`) only catches
a hang.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

HANG_GUARD_S = 30.0  # far beyond every timeout configured below: reaching it means a hang
FIRST_TOKEN_S = 0.5  # cuts what never comes
# What must arrive before a timeout (the first chunks of a stall) gets ROOM_S: far more than a busy
# machine needs, while the silence after them is what the (as long) idle timeout cuts.
ROOM_S = 3.0
HI = [{"role": "user", "content": "hi"}]
# The fake's failure for each phase after the connect (see tests/fakes/openai_upstream.py)
FAILURES = {
    "status line": FakeBehaviour(failure="hang"),
    "first event": FakeBehaviour(failure="headers"),
    "between events": FakeBehaviour(failure="stall", drop_after=2),
}


@contextmanager
def _unconnectable() -> Iterator[str]:
    """A base URL whose TCP connects hang: a listener with an accept queue of one, filled, never
    accepting; the kernel drops further SYNs, so a connect waits for its own timeout."""
    listener = socket.socket()
    filler = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        filler.close()
        listener.close()


@pytest.fixture
def hung_proxy():
    """`proxy(phase, assemble=...)`: a proxy whose model `m` sits on an upstream hung in `phase`
    (`assemble=None`: the model's default, no `assemble_from_stream` key)."""
    with ExitStack() as stack:

        def proxy(
            phase: str,
            *,
            assemble: bool | None,
            request_timeout_s: float = HANG_GUARD_S / 3,
            first_token_s=FIRST_TOKEN_S,
        ) -> str:
            if phase == "connect":
                url = stack.enter_context(_unconnectable())
            else:
                state = FakeState(behaviour=FAILURES[phase])
                url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
            model = {"name": "m", "base_url": url}
            if assemble is not None:
                model["assemble_from_stream"] = assemble
            resilience = {
                "first_token_timeout_s": first_token_s,
                "request_timeout_s": request_timeout_s,
                "breaker_fail_max": 1000,  # the deadlines alone end these requests, not an open breaker
                "max_attempts": 2,
            }
            # connects and reads wait far longer than the deadlines under test: only those can end a call
            upstream = {"connect_timeout_s": HANG_GUARD_S * 2, "read_timeout_s": HANG_GUARD_S * 2}
            upstream["stream_idle_timeout_s"] = ROOM_S
            settings = Settings(models=[model], resilience=resilience, upstream=upstream)
            return stack.enter_context(serve_in_thread(create_app(settings)))

        yield proxy


async def _ask(client: httpx.AsyncClient, base: str, stream: bool) -> tuple[int, list[bytes]]:
    """The status and, for a stream, its SSE data lines; a whole answer's body as one line."""
    body = {"model": "m", "messages": HI, "stream": stream}
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        if not stream or response.status_code != 200:
            return response.status_code, [await response.aread()]
        return response.status_code, [line.encode() async for line in response.aiter_lines() if line]


def _ask_all(base: str, concurrency: int) -> list[tuple[bool, int, list[bytes]]]:
    """`concurrency` clients at once, half of them streaming (one client: a stream, then a whole answer)."""

    async def run() -> list[tuple[bool, int, list[bytes]]]:
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=HANG_GUARD_S, limits=limits) as client:
            kinds = [i % 2 == 0 for i in range(max(concurrency, 2))]
            if concurrency == 1:
                return [(stream, *await _ask(client, base, stream)) for stream in kinds]
            answers = await asyncio.gather(*(_ask(client, base, stream) for stream in kinds))
            return [(stream, *answer) for stream, answer in zip(kinds, answers, strict=True)]

    return asyncio.run(run())


def _error(body: bytes) -> dict:
    return orjson.loads(body.removeprefix(b"data: "))["error"]


# whole answers asked as streams: by the model's default, and with the key set
ASSEMBLED = pytest.mark.parametrize("assemble", [None, True], ids=["default", "assembled"])


@ASSEMBLED
@pytest.mark.parametrize("concurrency", [1, 32])
@pytest.mark.parametrize("phase", ["connect", "status line", "first event"])
def test_no_first_token_ends_streams_and_whole_answers_at_the_first_token_timeout(
    hung_proxy, phase, concurrency, assemble
):
    base = hung_proxy(phase, assemble=assemble)
    answers = _ask_all(base, concurrency)
    for stream, status, lines in answers:
        assert status == 504, (stream, lines)  # before the first byte: a real status, for a stream too
        error = _error(lines[0])
        assert error["code"] == "upstream_timeout"
        assert f"no first token within {FIRST_TOKEN_S:g} s" in error["message"], error


@ASSEMBLED
@pytest.mark.parametrize("concurrency", [1, 32])
def test_a_stall_between_events_ends_a_stream_in_band_and_a_whole_answer_with_a_504(hung_proxy, concurrency, assemble):
    base = hung_proxy("between events", assemble=assemble, first_token_s=ROOM_S)
    for stream, status, lines in _ask_all(base, concurrency):
        if stream:
            assert status == 200 and len(lines) == 4, lines  # two chunks, the error, [DONE]
            assert _error(lines[2])["code"] == "upstream_timeout" and lines[3] == b"data: [DONE]"
        else:
            assert status == 504 and _error(lines[0])["code"] == "upstream_timeout", lines


@pytest.mark.parametrize("concurrency", [1, 32])
@pytest.mark.parametrize("phase", ["connect", "status line"])
def test_a_plain_whole_answer_and_a_stream_from_a_hung_upstream_end_by_the_request_deadline(
    hung_proxy, phase, concurrency
):
    """A plain whole answer has no first token to wait for: the request's deadline ends it. A stream
    to the same model still ends at its first-token timeout, sooner."""
    base = hung_proxy(phase, assemble=False, request_timeout_s=ROOM_S)
    for stream, status, lines in _ask_all(base, concurrency):
        assert status == 504, (stream, lines)
        message = _error(lines[0])["message"]
        if stream:
            assert f"no first token within {FIRST_TOKEN_S:g} s" in message, message
        else:
            assert f"request deadline of {ROOM_S:g} s" in message, message
