"""LiteLLM as a client: `litellm.completion(model="openai/<name>", api_base=<proxy>, api_key=...)`."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator

import litellm
import numpy as np
import openai
import pytest

from tests.clients.conftest import (
    API_KEY,
    CLAUDE_TEXT,
    EVERY_MODEL,
    GPT_TEXT,
    PROMPT,
    SAMPLING,
    TOOL_RESULT_HISTORY,
    WEATHER_ARGS,
    WEATHER_TOOL,
    sampling,
)
from tests.fakes.openai_upstream import fake_vector

ASK = [{"role": "user", "content": PROMPT}]
TOOL_MODELS = ("gpt", "gpt-litellm", "claude")


@pytest.fixture(autouse=True)
def event_loop_for_litellm(request) -> Iterator[None]:
    """LiteLLM's sync `completion` asks for the thread's event loop (`asyncio.get_event_loop()`, for its
    service logging), which makes one and never closes it; give it one that is closed after the test."""
    if inspect.iscoroutinefunction(request.function):  # pytest-asyncio's own loop
        yield
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def complete(switchyard, model: str, **kwargs):
    """`litellm.completion` as a team calls it (`api_base`, `api_key`), with an OpenAI client of the
    test's own: LiteLLM otherwise builds and caches one per call site, and drops some unclosed."""
    options = {**sampling(model), **kwargs}
    with openai.OpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as client:
        reply = litellm.completion(
            model=f"openai/{model}", api_base=switchyard.base_url, api_key=API_KEY, client=client, **options
        )
        return list(reply) if options.get("stream") else reply


@pytest.fixture(scope="module")
def tiny_text(sdk) -> str:
    return sdk.chat.completions.create(model="tiny", messages=ASK, **SAMPLING).choices[0].message.content


def _expected_text(model: str, tiny_text: str) -> str:
    return {"gpt": GPT_TEXT, "gpt-litellm": GPT_TEXT, "claude": CLAUDE_TEXT}.get(model, tiny_text)


@pytest.mark.parametrize("model", EVERY_MODEL)
def test_completion_and_stream(switchyard, tiny_text, model):
    reply = complete(switchyard, model, messages=ASK)
    assert reply.choices[0].message.content == _expected_text(model, tiny_text)
    assert reply.usage.completion_tokens > 0
    chunks = list(complete(switchyard, model, messages=ASK, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == _expected_text(model, tiny_text)


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_tools_and_streamed_tool_calls(switchyard, model):
    reply = complete(switchyard, model, messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL])
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", WEATHER_ARGS)
    assert reply.choices[0].finish_reason == "tool_calls"
    chunks = list(complete(switchyard, model, messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL], stream=True))
    rebuilt = litellm.stream_chunk_builder(chunks, messages=TOOL_RESULT_HISTORY[:1])
    (streamed,) = rebuilt.choices[0].message.tool_calls
    assert (streamed.function.name, json.loads(streamed.function.arguments)) == ("get_weather", WEATHER_ARGS)


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_a_tool_result_round_trip(switchyard, model):
    reply = complete(switchyard, model, messages=TOOL_RESULT_HISTORY, tools=[WEATHER_TOOL])
    assert reply.choices[0].message.content == (CLAUDE_TEXT if model == "claude" else GPT_TEXT)


def test_tools_through_auto_reach_a_model_that_can_call_them(switchyard):
    reply = complete(switchyard, "auto", messages=TOOL_RESULT_HISTORY[:1], tools=[WEATHER_TOOL], tool_choice="required")
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tools_to_the_embedded_model_are_a_400_naming_the_parameter(switchyard):
    with pytest.raises(litellm.BadRequestError, match=r"tiny.*tools"):
        complete(switchyard, "tiny", messages=ASK, tools=[WEATHER_TOOL], tool_choice="required")


async def test_acompletion_with_a_client_of_its_own(switchyard):
    # LiteLLM caches the async clients it builds for the whole process; one handed in is closed here.
    async with openai.AsyncOpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as client:
        reply = await litellm.acompletion(model="openai/claude", messages=ASK, max_tokens=12, client=client)
        chunks = [
            c
            async for c in await litellm.acompletion(
                model="openai/claude", messages=ASK, max_tokens=12, stream=True, client=client
            )
        ]
    assert reply.choices[0].message.content == CLAUDE_TEXT
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CLAUDE_TEXT


def test_embedding(switchyard):
    texts = ["first text", "second text"]
    with openai.OpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as client:  # as complete()
        reply = litellm.embedding(
            model="openai/embed", input=texts, api_base=switchyard.base_url, api_key=API_KEY, client=client
        )
    np.testing.assert_allclose([item["embedding"] for item in reply.data], [fake_vector(t) for t in texts], atol=1e-6)
    assert reply.usage.prompt_tokens == 4
