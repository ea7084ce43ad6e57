"""A whole answer read from the upstream's stream in bulk (`OpenAIHTTPBackend.complete_from_stream`)
is the answer assembled chunk by chunk from `stream()` (`Backend.complete_from_stream`), and the
caller hears the first event once and the number of events."""

from __future__ import annotations

from contextlib import ExitStack

import aiohttp
import pytest

from switchyard.backends.base import Backend
from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
REQUESTS = {
    "chat": ChatCompletionRequest.from_payload({"model": "m", "messages": HI}),
    "chat with logprobs": ChatCompletionRequest.from_payload(
        {"model": "m", "messages": HI, "logprobs": True, "top_logprobs": 2}
    ),
    "chat with tool calls": ChatCompletionRequest.from_payload({"model": "m", "messages": HI, "tools": TOOLS}),
    "completion with logprobs": CompletionRequest.from_payload({"model": "m", "prompt": "hi", "logprobs": 2}),
}


class Progress:
    def __init__(self) -> None:
        self.num_first_events, self.events_so_far = 0, 0

    def first_event(self) -> None:
        self.num_first_events += 1

    def num_events(self, num_events: int) -> None:
        self.events_so_far = num_events


@pytest.fixture
def upstream_url():
    state = FakeState(behaviour=FakeBehaviour(num_tokens=12, num_tool_calls=2))
    with ExitStack() as stack:
        yield stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"


@pytest.mark.parametrize("kind", REQUESTS)
async def test_the_bulk_read_assembles_what_the_chunks_do(upstream_url, kind):
    request = REQUESTS[kind]
    async with aiohttp.ClientSession() as session:
        backend = OpenAIHTTPBackend("m", [Replica(upstream_url)], session, upstream_model="vendor/m-1")
        bulk_progress, chunk_progress = Progress(), Progress()
        bulk = await backend.complete_from_stream(request, None, bulk_progress)
        by_chunk = await Backend.complete_from_stream(backend, request, None, chunk_progress)
    answer = bulk.parsed
    assert answer["choices"] and answer["usage"]["completion_tokens"] > 0
    assert answer["model"] == "m" and bulk.upstream_model == by_chunk.upstream_model == "vendor/m-1"
    # the fake stamps each answer with its own time: the rest is the same
    assert {**answer, "created": 0} == {**by_chunk.parsed, "created": 0}
    assert bulk_progress.num_first_events == chunk_progress.num_first_events == 1
    assert bulk_progress.events_so_far == chunk_progress.events_so_far > 1
