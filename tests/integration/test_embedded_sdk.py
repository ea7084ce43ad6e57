"""The embedded backend behind the proxy, on a tiny random model, through the real `openai` SDK."""

from __future__ import annotations

import itertools
import re
import threading

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import build_tiny_model

SPECIAL = r"<\|\w+\|>|<eos>"
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
TIMEOUT_S = 30  # bounds a hang only


@pytest.fixture(scope="module")
def embedded_proxy(tmp_path_factory):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    engine = {"num_blocks": 64, "page_size": 16, "context_window": 256, "default_max_tokens": 16}
    settings = Settings(
        models=[
            {"name": "tiny", "backend": "embedded", "model": str(model_dir), "engine": engine, "tier": "small"},
            {"name": "broken", "backend": "embedded", "model": str(model_dir / "missing.gguf")},
        ],
        upstream={"health_interval_s": 0.2},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        # bounds a hang only: loading even a tiny model takes long on a busy machine
        assert wait_until(
            lambda: httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["ready"], timeout_s=MODEL_LOAD_BOUND_S
        )
        yield url + "/v1", app


@pytest.fixture
def sdk(embedded_proxy):
    with openai.OpenAI(base_url=embedded_proxy[0], api_key="k", max_retries=0) as client:
        yield client


def test_chat_stream_and_non_stream_agree(sdk):
    raw = sdk.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2
    )
    assert raw.headers["x-switchyard-backend"] == "embedded#0"
    reply = raw.parse()
    choice = reply.choices[0]
    assert choice.finish_reason in ("length", "stop")
    tokens = choice.logprobs.content
    assert len(tokens) == reply.usage.completion_tokens - (choice.finish_reason == "stop")
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
    # Special tokens (a random model emits them) show in logprobs but not in the text, as in vLLM.
    assert re.sub(SPECIAL, "", "".join(t.token for t in tokens)) == choice.message.content
    chunks = list(
        sdk.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens > 0


def test_stop_strings_cut_the_answer(sdk):
    full = sdk.completions.create(model="tiny", prompt="one two three", temperature=0, max_tokens=16).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    cut = sdk.completions.create(model="tiny", prompt="one two three", temperature=0, max_tokens=16, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completion_logprobs_in_the_legacy_format(sdk):
    reply = sdk.completions.create(model="tiny", prompt="paris is", temperature=0, max_tokens=5, logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert re.sub(SPECIAL, "", "".join(logprobs.tokens)) == reply.choices[0].text
    assert all(len(top) <= 3 for top in logprobs.top_logprobs)


def test_seeded_sampling_repeats(sdk):
    def draw():
        return sdk.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1.0, seed=42, max_tokens=10)

    assert draw().choices[0].message.content == draw().choices[0].message.content


def test_over_the_context_window_is_a_400(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1000)
    error = info.value.response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in error["message"]


def test_n_above_one_is_a_400(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
    assert info.value.response.json()["error"]["param"] == "n"


def test_a_model_that_failed_to_load_is_a_503_and_not_ready(sdk, embedded_proxy):
    with pytest.raises(openai.InternalServerError) as info:
        sdk.chat.completions.create(model="broken", messages=MESSAGES)
    assert info.value.status_code == 503
    assert "missing.gguf" in info.value.response.json()["error"]["message"]
    assert info.value.response.headers["retry-after"] == "5"
    ready = httpx.get(embedded_proxy[0].removesuffix("/v1") + "/health/ready").json()
    assert ready["models"] == {"tiny": True, "broken": False}


def test_client_disconnect_frees_the_engine(embedded_proxy, monkeypatch):
    url, app = embedded_proxy
    engine = app.state.services.registry.get("tiny").backend.engine
    # The batching thread stops after 5 of the 200 tokens until the test is done: the answer cannot
    # end by itself, only the client's leaving frees it. With logprobs, each token is a chunk (the
    # random model's first tokens show no text): the client's two chunks come before the stop.
    release, num_chosen, record_choice = threading.Event(), itertools.count(1), engine.record_choice

    def record_then_hold(request_id, choice) -> None:
        record_choice(request_id, choice)
        if next(num_chosen) >= 5:
            release.wait(TIMEOUT_S)

    monkeypatch.setattr(engine, "record_choice", record_then_hold)
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 200,
        "temperature": 0,
        "logprobs": True,
    }
    try:
        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=TIMEOUT_S) as response:
            lines = response.iter_lines()
            for _ in range(4):
                next(lines)
            assert engine.num_reserved_blocks > 0
        assert wait_until(lambda: engine.num_reserved_blocks == 0, timeout_s=TIMEOUT_S)
    finally:
        release.set()


async def test_concurrent_streams_match_their_solo_answers(embedded_proxy):
    import asyncio

    url, _ = embedded_proxy
    prompts = ["one two", "paris is", "a stitch in time", "the lazy dog"]
    async with openai.AsyncOpenAI(base_url=url, api_key="k", max_retries=0) as sdk:

        async def answer(prompt: str) -> str:
            stream = await sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=10, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        solo = [await answer(p) for p in prompts]
        together = await asyncio.gather(*(answer(p) for p in prompts * 3))
    assert together == solo * 3


def test_the_anthropic_sdk_is_answered_by_the_embedded_engine(embedded_proxy):
    import anthropic

    base = embedded_proxy[0].removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="k", max_retries=0) as client:
        message = client.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=MESSAGES)
        with client.messages.stream(model="tiny", max_tokens=8, messages=MESSAGES) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        counted = client.messages.with_raw_response.count_tokens(model="tiny", messages=MESSAGES)
        document = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [document]}])
    usage = message.usage
    assert message.stop_reason in ("end_turn", "max_tokens") and usage.output_tokens > 0
    assert usage.input_tokens + usage.cache_read_input_tokens > 0
    assert final.usage.output_tokens > 0 and final.content[0].text == streamed
    assert counted.headers["x-switchyard-token-count"] == "exact" and counted.parse().input_tokens > 0
    assert refused.value.body["error"]["type"] == "invalid_request_error" and "documents" in refused.value.message
