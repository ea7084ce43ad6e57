"""llama-index through `OpenAILike` (llama-index-llms-openai-like): chat, stream_chat, tools.

llama-index-llms-openai 0.8.3 (the newest) needs openai<3, and the openai SDK in .venv is 3.x:
`make test-clients-openai2` runs this file in an env of its own, with openai 2.x (tests/clients/own_env.py);
in .venv it skips."""

from __future__ import annotations

import pytest

from tests.clients.conftest import API_KEY, CLAUDE_TEXT, GPT_TEXT, PROMPT, SAMPLING
from tests.clients.own_env import import_client

EMBEDDED = ("tiny", "auto", "cascade")  # answered by the tiny model, seeded

openai_like = import_client(
    "llama_index.llms.openai_like", "llama-index-llms-openai needs openai<3; the openai SDK here is 3.x"
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


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


@pytest.mark.parametrize("model", ("gpt", "gpt-litellm", "claude"))
def test_chat_with_tools(switchyard, model):
    from llama_index.core.tools import FunctionTool

    model_llm = llm(switchyard, model)
    response = model_llm.chat_with_tools([FunctionTool.from_defaults(fn=get_weather)], user_msg="Weather in Paris?")
    (call,) = model_llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert (call.tool_name, call.tool_kwargs) == ("get_weather", {"city": "paris"})
