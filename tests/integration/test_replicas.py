"""Several replicas of one model: least outstanding requests, and unready replicas skipped."""

from __future__ import annotations

import asyncio
import threading
from contextlib import ExitStack

import httpx
import openai

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

TIMEOUT_S = 30  # bounds a hang only


def _proxy(stack: ExitStack, replica_urls: list[str]):
    """The base URL (ending in /v1) of a proxy over the replicas, and its app."""
    settings = Settings(
        models=[{"name": "pair", "replicas": [{"base_url": url} for url in replica_urls]}],
        # a probe a busy machine answers slowly must not mark a replica down
        upstream={"health_interval_s": 0.2, "health_timeout_s": TIMEOUT_S},
    )
    app = create_app(settings)
    return stack.enter_context(serve_in_thread(app)) + "/v1", app


async def _stream_all(base_url: str, n: int) -> list[str]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:

        async def one() -> str:
            async with sdk.chat.completions.with_streaming_response.create(
                model="pair", messages=[{"role": "user", "content": "hi"}], stream=True
            ) as response:
                [chunk async for chunk in await response.parse()]
                return response.headers["x-switchyard-backend"]

        return await asyncio.gather(*(one() for _ in range(n)))


def test_concurrent_requests_spread_over_replicas_evenly():
    all_in = threading.Event()  # every request is held upstream until all 8 are there: all in flight at once
    states = [FakeState(behaviour=FakeBehaviour(wait_for=all_in)) for _ in range(2)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for s in states]
        base_url, _ = _proxy(stack, urls)

        async def eight_at_once() -> list[str]:
            streams = asyncio.create_task(_stream_all(base_url, 8))
            try:
                arrived = lambda: sum(s.num_requests for s in states) == 8  # noqa: E731
                assert await asyncio.to_thread(wait_until, arrived, TIMEOUT_S)
            finally:
                all_in.set()
            return await streams

        backends = asyncio.run(eight_at_once())
    assert [s.num_requests for s in states] == [4, 4]
    assert sorted(set(backends)) == ["openai#0", "openai#1"]  # each replica by its place in the list


def test_an_unready_replica_gets_no_traffic():
    state = FakeState()
    with ExitStack() as stack:
        good = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        base_url, app = _proxy(stack, [f"http://127.0.0.1:{closed_port()}/v1", good])
        closed, _ = app.state.services.registry.get("pair").backend.replicas
        # The health watcher marks the closed replica down; every request then lands on the good one.
        assert wait_until(lambda: not closed.is_ready, timeout_s=TIMEOUT_S)
        assert httpx.get(base_url + "/models", timeout=TIMEOUT_S).json()["data"][0]["ready"] is True
        with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:
            for _ in range(6):
                sdk.chat.completions.create(model="pair", messages=[{"role": "user", "content": "hi"}])
    assert state.num_requests == 6
