"""The real SmolLM2-135M-Instruct from its wheel, served by `switchyard engine serve`, reached
through the proxy like a vLLM server."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from switchyard.backends.embedded.models import is_installed
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    port = closed_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    argv = [
        sys.executable,
        "-m",
        "switchyard",
        "engine",
        "serve",
        "--model",
        "smollm2-135m",
        "--port",
        str(port),
        "--name",
        "smollm2",
    ]
    with log.open("wb") as out, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT) as process:
        base = f"http://127.0.0.1:{port}"

        def is_ready() -> bool:
            try:
                return httpx.get(base + "/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        try:
            assert wait_until(is_ready, timeout_s=MODEL_LOAD_BOUND_S, interval_s=0.5), log.read_text()[-3000:]
            yield base + "/v1"
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def proxy(engine_server):
    settings = Settings(
        models=[{"name": "local-small", "base_url": engine_server, "upstream_model": "smollm2"}],
        resilience={"first_token_timeout_s": 300},  # a CPU model on a busy machine: only a hang is cut
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1"


def test_capital_of_france(proxy):
    with openai.OpenAI(base_url=proxy, api_key="k", max_retries=0) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(
            model="local-small",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=24,
            logprobs=True,
            top_logprobs=5,
        )
    reply = raw.parse()
    assert raw.headers["x-switchyard-model"] == "local-small"
    assert raw.headers["x-switchyard-backend"] == "openai#0"
    assert "Paris" in reply.choices[0].message.content
    for token in reply.choices[0].logprobs.content:
        assert token.logprob <= 0
        values = [alt.logprob for alt in token.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) == 5


def test_streams_token_by_token(proxy):
    with openai.OpenAI(base_url=proxy, api_key="k", max_retries=0) as sdk:
        chunks = list(
            sdk.chat.completions.create(
                model="local-small",
                messages=[{"role": "user", "content": "Name three colours."}],
                temperature=0,
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 5
    assert chunks[-1].usage.completion_tokens <= 20


@pytest.mark.skipif(
    not is_installed("gemma3-270m"),
    reason="Gemma-3-270M is opt-in (switchyard models install gemma3-270m; Gemma Terms of Use)",
)
async def test_gemma_answers_a_chat_through_the_plain_transcript():
    from switchyard.backends.embedded.backend import EmbeddedBackend
    from switchyard.core.chat_wire import ChatCompletionRequest

    backend = EmbeddedBackend("local-large", "gemma3-270m")
    await backend.start()
    try:
        assert backend.is_ready(), (await backend.health()).detail
        request = ChatCompletionRequest.from_payload(
            {
                "model": "local-large",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0,
                "max_tokens": 24,
            }
        )
        reply = (await backend.complete(request)).as_chat_completion()
    finally:
        await backend.aclose()
    assert "Paris" in reply.choices[0].message.content
    assert "User:" not in reply.choices[0].message.content
