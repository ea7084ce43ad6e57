"""A proxy with two `backend: litellm` models in front of fake upstreams: `claude` (the fake
Anthropic Messages API) and `gpt` and `reasoner` (the fake OpenAI API); the client is the real `openai` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import openai

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread


@dataclass
class CommercialProxy:
    sdk: openai.OpenAI
    base_url: str
    claude: AnthropicState
    gpt: FakeState
    app: Any

    def last_sent(self, model: str) -> dict[str, Any]:
        """The body the fake upstream of `model` last received."""
        return self.claude.requests[-1] if model == "claude" else self.gpt.records[-1].body

    def num_sent(self, model: str) -> int:
        return len(self.claude.requests) if model == "claude" else len(self.gpt.records)


@contextmanager
def commercial_proxy(**settings: Any) -> Iterator[CommercialProxy]:
    claude, gpt = AnthropicState(), FakeState()
    with ExitStack() as stack:
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(claude)))
        openai_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(gpt)))
        models = [
            {
                "name": "claude",
                "backend": "litellm",
                "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                "base_url": anthropic_url,
                "api_key": "sk-ant-test",
            },
            {
                "name": "gpt",
                "backend": "litellm",
                "litellm_model": "openai/gpt-4o",
                "base_url": openai_url + "/v1",
                "api_key": "sk-test",
            },
            {  # a reasoning model (LiteLLM knows it takes reasoning_effort), on the same fake
                "name": "reasoner",
                "backend": "litellm",
                "litellm_model": "openai/o3-mini",
                "base_url": openai_url + "/v1",
                "api_key": "sk-test",
            },
        ]
        app = create_app(Settings(models=models, **({"resilience": {"max_attempts": 1}} | settings)))
        base = stack.enter_context(serve_in_thread(app))
        sdk = stack.enter_context(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0))
        yield CommercialProxy(sdk, base, claude, gpt, app)
