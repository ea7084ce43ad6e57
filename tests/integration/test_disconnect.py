"""A client that goes away mid-stream takes the upstream request down with it."""

from __future__ import annotations

import httpx

from tests.helpers import wait_until

TIMEOUT_S = 30  # bounds a hang only
ENDLESS = 100_000  # tokens: the upstream's stream never ends by itself, only the client's leaving ends it


def test_client_disconnect_cancels_the_upstream_stream(proxy_url, fake_state):
    fake_state.behaviour.num_tokens = ENDLESS
    fake_state.behaviour.token_delay_s = 0.05
    with httpx.stream(
        "POST",
        proxy_url + "/chat/completions",
        json={
            "model": "fake-small",
            "messages": [{"role": "user", "content": "long story"}],
            "stream": True,
        },
        timeout=TIMEOUT_S,
    ) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(3)]
    assert all(line.startswith("data: {") or line == "" for line in received)
    record = fake_state.records[-1]
    assert wait_until(lambda: record.disconnected_at is not None, timeout_s=TIMEOUT_S)


def test_async_sdk_close_cancels_the_upstream_stream(proxy_url, fake_state):
    import asyncio

    import openai

    fake_state.behaviour.num_tokens = ENDLESS
    fake_state.behaviour.token_delay_s = 0.05

    async def read_two_then_close() -> None:
        async with openai.AsyncOpenAI(base_url=proxy_url, api_key="k", max_retries=0) as sdk:
            stream = await sdk.chat.completions.create(
                model="fake-small", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 2:
                    break
            await stream.close()

    asyncio.run(read_two_then_close())
    record = fake_state.records[-1]
    assert wait_until(lambda: record.disconnected_at is not None, timeout_s=TIMEOUT_S)
