"""Several replicas of one model: least outstanding requests, and unready replicas skipped."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import openai

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until


def _proxy(stack: ExitStack, replica_urls: list[str]) -> str:
    settings = Settings(
        models=[{"name": "pair", "replicas": [{"base_url": url} for url in replica_urls]}],
        upstream={"health_interval_s": 0.2},
    )
    return stack.enter_context(serve_in_thread(create_app(settings))) + "/v1"


async def _stream_all(base_url: str, n: int) -> list[str]:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:

        async def one() -> str:
            async with sdk.chat.completions.with_streaming_response.create(
                model="pair", messages=[{"role": "user", "content": "hi"}], stream=True
            ) as response:
                [chunk async for chunk in await response.parse()]
                return response.headers["x-switchyard-backend"]

        return await asyncio.gather(*(one() for _ in range(n)))


def test_concurrent_requests_spread_over_replicas_evenly():
    states = [FakeState(behaviour=FakeBehaviour(token_delay_s=0.05)) for _ in range(2)]
    with ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for s in states]
        backends = asyncio.run(_stream_all(_proxy(stack, urls), 8))
    assert [s.num_requests for s in states] == [4, 4]
    assert sorted(set(backends)) == ["openai#0", "openai#1"]  # each replica by its place in the list


def test_an_unready_replica_gets_no_traffic():
    state = FakeState()
    with ExitStack() as stack:
        good = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        base_url = _proxy(stack, [f"http://127.0.0.1:{closed_port()}/v1", good])
        models_url = base_url + "/models"
        import httpx

        assert wait_until(lambda: httpx.get(models_url).json()["data"][0]["ready"] is True)
        with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
            # The health watcher marks the closed replica down; every request then lands on the good one.
            for _ in range(6):
                sdk.chat.completions.create(model="pair", messages=[{"role": "user", "content": "hi"}])
    assert state.num_requests == 6
