"""llama-index through `OpenAILike` (llama-index-llms-openai-like): chat, stream_chat, tools.

Skipped where it does not install: llama-index-llms-openai 0.8.3 (the newest) needs openai<3, and
this project's openai SDK is 3.x (docs/clients.md says so too)."""

from __future__ import annotations

import pytest

from tests.clients.conftest import API_KEY, CLAUDE_TEXT, GPT_TEXT, PROMPT, SAMPLING

EMBEDDED = ("tiny", "auto", "cascade")  # answered by the tiny model, seeded

openai_like = pytest.importorskip(
    "llama_index.llms.openai_like",
    reason="llama-index-llms-openai needs openai<3; the openai SDK here is 3.x (docs/clients.md)",
)
from llama_index.core.llms import ChatMessage  # noqa: E402


def llm(switchyard, model: str):
    seeded = {"temperature": 1.0, "additional_kwargs": {"seed": SAMPLING["seed"]}} if model in EMBEDDED else {}
    return openai_like.OpenAILike(
        **seeded,
        model=model,
        api_base=switchyard.base_url,
        api_key=API_KEY,
        is_chat_model=True,
        is_function_calling_model=model in ("gpt", "gpt-litellm", "claude"),
        context_window=8192,
        max_tokens=12,
        max_retries=0,
    )


@pytest.mark.parametrize(("model", "text"), [("gpt", GPT_TEXT), ("gpt-litellm", GPT_TEXT), ("claude", CLAUDE_TEXT)])
def test_chat_and_stream_chat(switchyard, model, text):
    messages = [ChatMessage(role="user", content=PROMPT)]
    assert llm(switchyard, model).chat(messages).message.content == text
    assert "".join(r.delta or "" for r in llm(switchyard, model).stream_chat(messages)) == text


@pytest.mark.parametrize("model", ("auto", "cascade"))
def test_auto_and_cascade_answer_as_the_model_they_route_to(switchyard, model):
    messages = [ChatMessage(role="user", content=PROMPT)]
    assert (
        llm(switchyard, model).chat(messages).message.content == llm(switchyard, "tiny").chat(messages).message.content
    )
