"""The cascade over two real embedded engines (a tiny random Llama): the engine's own logprobs are
judged, and a replayed stream is exactly the answer the rung gives without the cascade."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import build_tiny_model

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    engine = {"num_blocks": 64, "page_size": 16, "context_window": 256, "default_max_tokens": 16, "threads": 1}
    settings = Settings(
        models=[
            {"name": name, "backend": "embedded", "model": str(model_dir), "engine": engine}
            for name in ("tiny-a", "tiny-b")
        ],
        cascade={"ladder": ["tiny-a", "tiny-b"], "scorer": "mean_logprob", "threshold": -1e9, "stream_tokens": 4},
        billing={"ledger_path": None},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url:
        models = lambda: httpx.get(url + "/v1/models", timeout=60).json()["data"]  # noqa: E731
        # bounds a hang only: loading even a tiny model takes long on a busy machine
        assert wait_until(lambda: all(m["ready"] for m in models()), timeout_s=MODEL_LOAD_BOUND_S)
        yield url + "/v1", app


def _set_threshold(app, value: float) -> None:
    rungs = app.state.services.cascade.rungs
    rungs[0] = dataclasses.replace(rungs[0], threshold=value)


def test_an_accepted_stream_replays_the_rungs_own_answer(tiny_ladder):
    url, app = tiny_ladder
    _set_threshold(app, -1e9)
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        plain = sdk.chat.completions.create(model="tiny-a", messages=MESSAGES, temperature=0, max_tokens=12)
        with sdk.chat.completions.with_streaming_response.create(
            model="cascade", messages=MESSAGES, temperature=0, max_tokens=12, stream=True
        ) as response:
            assert response.headers["x-switchyard-model"] == "tiny-a"
            assert response.headers["x-switchyard-cascade"].startswith("tiny-a(")
            chunks = [c for c in response.parse() if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert all(c.choices[0].logprobs is None for c in chunks)


def test_low_engine_confidence_escalates(tiny_ladder):
    url, app = tiny_ladder
    _set_threshold(app, 0.0)  # every logprob is below 0: never confident
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(model="cascade", messages=MESSAGES, max_tokens=8)
        streamed = sdk.chat.completions.with_raw_response.create(
            model="cascade", messages=MESSAGES, max_tokens=8, stream=True
        )
        assert streamed.headers["x-switchyard-model"] == "tiny-b"
        assert sum(1 for c in streamed.parse() if c.choices) > 0
    assert raw.headers["x-switchyard-model"] == "tiny-b"
    assert raw.headers["x-switchyard-cascade"].endswith("<0.00)->tiny-b")


def test_legacy_completions_are_judged_on_their_own_logprobs_format(tiny_ladder):
    url, app = tiny_ladder
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as sdk:
        _set_threshold(app, -1e9)
        plain = sdk.completions.create(model="tiny-a", prompt="the quick brown", temperature=0, max_tokens=10)
        accepted = sdk.completions.with_raw_response.create(
            model="cascade", prompt="the quick brown", temperature=0, max_tokens=10
        )
        assert accepted.headers["x-switchyard-model"] == "tiny-a"
        assert accepted.parse().choices[0].text == plain.choices[0].text
        assert accepted.parse().choices[0].logprobs is None  # asked for by the cascade only
        streamed = sdk.completions.create(
            model="cascade", prompt="the quick brown", temperature=0, max_tokens=10, stream=True
        )
        assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text
        _set_threshold(app, 0.0)
        escalated = sdk.completions.with_raw_response.create(model="cascade", prompt="the quick brown", max_tokens=6)
        assert escalated.headers["x-switchyard-cascade"].endswith("<0.00)->tiny-b")
