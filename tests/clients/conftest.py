"""One Switchyard proxy per test module, with every kind of model a client may be pointed at:

    gpt          backend openai (upstream_model gpt-4o-fake), tier large  -> fake OpenAI
    gpt-litellm  backend litellm, openai/gpt-4o                           -> fake OpenAI
    claude       backend litellm, anthropic/claude-3-5-sonnet-20241022    -> fake Anthropic
    tiny         backend embedded (tests/tiny_model.py), tier small
    auto         tiers small, large: the score is read out of the prompt ("score=0.9"), else 0
    cascade      tiny, then gpt; tiny's answers are always accepted

The fakes answer tools and JSON modes (tests/clients/upstreams.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
import openai
import pytest
from pydantic import BaseModel

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.clients.upstreams import ToolingAnthropicUpstream, ToolingOpenAIUpstream
from tests.fakes.anthropic_upstream import AnthropicState
from tests.fakes.openai_upstream import FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import build_tiny_model

# LiteLLM as a client would fetch its price map from the network at import (the proxy's backend sets
# the same before it imports LiteLLM, but a test module may import it first).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

API_KEY = "sk-client-test"
UPSTREAM_MODEL = "gpt-4o-fake"
GPT_TEXT = "alpha bravo charlie delta echo "  # what the fake OpenAI upstream says
CLAUDE_TEXT = "bonjour from claude "  # what the fake Anthropic upstream says
PROMPT = "the quick brown fox"
# The tiny model says only special tokens at temperature 0; seeded sampling gives text, every time the same.
SAMPLING = {"temperature": 1.0, "seed": 7, "max_tokens": 12}


def sampling(model: str) -> dict:
    """SAMPLING for the models the tiny one answers; Anthropic has no `seed` (LiteLLM says so in a 400)."""
    return SAMPLING if model in ("tiny", "auto", "cascade") else {"max_tokens": 12}


EXPLICIT = ("gpt", "gpt-litellm", "claude", "tiny")
EVERY_MODEL = (*EXPLICIT, "auto", "cascade")


@dataclass
class Proxy:
    url: str  # http://127.0.0.1:PORT
    base_url: str  # url + /v1, what clients are given
    openai_state: FakeState
    anthropic_state: AnthropicState
    app: object


def _score_from_prompt(texts: list[str]) -> np.ndarray:
    return np.array([float(m.group(1)) if (m := re.search(r"score=([\d.]+)", t)) else 0.0 for t in texts])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def switchyard(tiny_model_dir: Path) -> Iterator[Proxy]:
    openai_state, anthropic_state = FakeState(), AnthropicState()
    with ExitStack() as stack:
        openai_url = stack.enter_context(serve_in_thread(ToolingOpenAIUpstream(openai_state))) + "/v1"
        anthropic_url = stack.enter_context(serve_in_thread(ToolingAnthropicUpstream(anthropic_state)))
        engine = {"num_blocks": 64, "page_size": 16, "context_window": 512, "default_max_tokens": 16, "threads": 1}
        settings = Settings(
            models=[
                {
                    "name": "gpt",
                    "base_url": openai_url,
                    "api_key": "sk-up",
                    "upstream_model": UPSTREAM_MODEL,
                    "tier": "large",
                },
                {
                    "name": "gpt-litellm",
                    "backend": "litellm",
                    "litellm_model": "openai/gpt-4o",
                    "base_url": openai_url,
                    "api_key": "sk-up",
                },
                {
                    "name": "claude",
                    "backend": "litellm",
                    "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                    "base_url": anthropic_url,
                    "api_key": "sk-ant-up",
                },
                {"name": "embed", "kind": "embedding", "base_url": openai_url, "api_key": "sk-up"},
                {
                    "name": "tiny",
                    "backend": "embedded",
                    "model": str(tiny_model_dir),
                    "engine": engine,
                    "tier": "small",
                },
            ],
            routing={
                "auto": {"tiers": ["small", "large"], "thresholds": [0.5], "warm_up": False, "deadline_ms": 10_000}
            },
            cascade={"ladder": ["tiny", "gpt"], "scorer": "mean_logprob", "threshold": -1e9, "stream_tokens": 4},
            resilience={"max_attempts": 1},
            # a health probe late on a busy machine must not take a tier out of the routes
            upstream={"health_interval_s": 0.2, "health_timeout_s": 30},
            billing={"ledger_path": None},
        )
        app = create_app(settings, score_batch=_score_from_prompt)
        url = stack.enter_context(serve_in_thread(app))
        models = lambda: httpx.get(url + "/v1/models", timeout=30).json()["data"]  # noqa: E731
        assert wait_until(lambda: all(m["ready"] for m in models()), timeout_s=MODEL_LOAD_BOUND_S)
        yield Proxy(url, url + "/v1", openai_state, anthropic_state, app)


@pytest.fixture(scope="module")
def sdk(switchyard: Proxy) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_ARGS = {"city": "paris"}  # what the fakes call it with (the schema's example)
TOOL_RESULT_HISTORY = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


class Verdict(BaseModel):
    """Structured output small enough that a random model under constrained decoding finishes it."""

    answer: Literal["yes", "no"]
    sure: bool
