"""The semantic response cache through the proxy (the process's MiniLM, loaded once for this
module): a reworded question in the same conversation is a hit with its similarity in the header,
one the guard tells apart (another number) is a miss however similar, and another conversation
around the same question is searched apart."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import openai
import pytest

from switchyard.backends.embedded.minilm import shared_minilm
from switchyard.cache.guard import DEFAULT_SIMILARITY
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    state = FakeState()
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        settings = Settings(
            models=[{"name": "m", "base_url": upstream}],
            cache={"mode": "semantic"},
            billing={"ledger_path": None, "redis_url": "none"},
        )
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        sdk = stack.enter_context(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=120))
        yield sdk, state


def _similarity(a: str, b: str) -> float:
    vectors = shared_minilm().encode([a, b], normalize_embeddings=True)
    return float(np.dot(vectors[0], vectors[1]))


def _ask(sdk, question: str, system: str | None = None):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return sdk.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=5, temperature=0)


def test_a_reworded_question_is_a_semantic_hit(proxy):
    sdk, state = proxy
    asked, reworded = "How do I reset my account password?", "How can I reset my account password?"
    assert _similarity(asked, reworded) >= DEFAULT_SIMILARITY
    first = _ask(sdk, asked)
    calls = state.num_requests
    second = _ask(sdk, reworded)
    assert first.headers["x-switchyard-cache"] == "miss"
    value, similarity = second.headers["x-switchyard-cache"].split("; similarity=")
    assert value == "hit" and DEFAULT_SIMILARITY <= float(similarity) <= 1.0
    assert state.num_requests == calls
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    # the same question in another conversation (another system prompt) is not its neighbour
    assert _ask(sdk, reworded, system="Answer in French.").headers["x-switchyard-cache"] == "miss"


def test_the_guard_refuses_a_neighbour_with_another_number_however_similar(proxy):
    sdk, state = proxy
    asked, other = (
        "What is the boiling point of water at 1200 meters?",
        "What is the boiling point of water at 1500 meters?",
    )
    assert _similarity(asked, other) >= DEFAULT_SIMILARITY  # cosine alone would have served it
    _ask(sdk, asked)
    calls = state.num_requests
    assert _ask(sdk, other).headers["x-switchyard-cache"] == "miss"
    assert state.num_requests == calls + 1
    assert _ask(sdk, other).headers["x-switchyard-cache"] == "hit"  # its own answer, kept exactly
