"""LangChain's `ChatOpenAI` (langchain-openai): invoke, stream, `bind_tools`, `with_structured_output`."""

from __future__ import annotations

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
    WEATHER_ARGS,
    WEATHER_TOOL,
    Verdict,
    sampling,
)
from tests.fakes.openai_upstream import fake_vector

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage  # noqa: E402

TOOL_MODELS = ("gpt", "gpt-litellm", "claude")


def chat(switchyard, model: str, **kwargs) -> langchain_openai.ChatOpenAI:
    options = {**sampling(model), **kwargs}
    return langchain_openai.ChatOpenAI(
        model=model, base_url=switchyard.base_url, api_key=API_KEY, max_retries=0, stream_usage=True, **options
    )


@pytest.fixture(scope="module")
def tiny_text(sdk) -> str:
    return (
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], **SAMPLING)
        .choices[0]
        .message.content
    )


def _expected_text(model: str, tiny_text: str) -> str:
    return {"gpt": GPT_TEXT, "gpt-litellm": GPT_TEXT, "claude": CLAUDE_TEXT}.get(model, tiny_text)


@pytest.mark.parametrize("model", EVERY_MODEL)
def test_invoke_and_stream(switchyard, tiny_text, model):
    llm = chat(switchyard, model)
    message = llm.invoke(PROMPT)
    assert message.content == _expected_text(model, tiny_text)
    assert message.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream(PROMPT))
    assert "".join(c.content for c in chunks) == message.content
    assert sum(chunks[1:], chunks[0]).usage_metadata["output_tokens"] > 0


async def test_ainvoke_and_astream(switchyard, tiny_text):
    # One event loop for both: langchain-openai caches its async HTTP client per base URL, and a
    # client bound to a closed loop (pytest-asyncio's previous one) cannot be reused.
    for model in ("claude", "auto"):
        llm = chat(switchyard, model)
        message = await llm.ainvoke([HumanMessage(PROMPT)])
        streamed = "".join([c.content async for c in llm.astream([HumanMessage(PROMPT)])])
        assert message.content == streamed == _expected_text(model, tiny_text)


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_bind_tools_returns_tool_calls(switchyard, model):
    llm = chat(switchyard, model).bind_tools([WEATHER_TOOL])
    message = llm.invoke("What is the weather in Paris?")
    (call,) = message.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", WEATHER_ARGS)
    streamed = sum(llm.stream("What is the weather in Paris?"), AIMessageChunk(content=""))
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [("get_weather", WEATHER_ARGS)]


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_a_tool_message_round_trip(switchyard, model):
    llm = chat(switchyard, model).bind_tools([WEATHER_TOOL])
    question = HumanMessage("What is the weather in Paris?")
    call = llm.invoke([question])
    answer = llm.invoke([question, call, ToolMessage("sunny, 21 C", tool_call_id=call.tool_calls[0]["id"])])
    assert answer.content == (CLAUDE_TEXT if model == "claude" else GPT_TEXT)
    assert not answer.tool_calls


@pytest.mark.parametrize("model", ("auto", "cascade"))
def test_bind_tools_through_auto_and_cascade(switchyard, model):
    message = chat(switchyard, model).bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("Weather in Paris?")
    assert message.tool_calls[0]["args"] == WEATHER_ARGS
    assert message.response_metadata["model_name"] == "gpt"


def test_bind_tools_on_a_model_that_cannot_call_them_is_a_clear_400(switchyard):
    with pytest.raises(openai.BadRequestError) as info:
        chat(switchyard, "tiny").bind_tools([WEATHER_TOOL]).invoke("Weather in Paris?")
    assert (info.value.code, info.value.param) == ("unsupported_parameter", "tools")


@pytest.mark.parametrize("method", ("json_schema", "function_calling"))
@pytest.mark.parametrize("model", TOOL_MODELS)
def test_with_structured_output(switchyard, model, method):
    structured = chat(switchyard, model).with_structured_output(Verdict, method=method)
    assert structured.invoke("Is Paris the capital of France?") == Verdict(answer="yes", sure=True)


def test_with_structured_output_on_the_embedded_model(switchyard):
    structured = chat(switchyard, "tiny", max_tokens=64).with_structured_output(Verdict, method="json_schema")
    assert isinstance(structured.invoke(PROMPT), Verdict)


def test_response_metadata_names_the_configured_model(switchyard):
    assert chat(switchyard, "gpt").invoke(PROMPT).response_metadata["model_name"] == "gpt"


def test_default_headers_reach_the_proxy(switchyard):
    llm = chat(switchyard, "auto", default_headers={"x-switchyard-quality": "cheapest"})  # not a quality mode
    with pytest.raises(openai.BadRequestError) as info:
        llm.invoke(PROMPT)
    assert info.value.param == "x-switchyard-quality"


def test_openai_embeddings(switchyard):
    # check_embedding_ctx_length=False: LangChain otherwise splits texts with tiktoken's cl100k_base,
    # which it downloads (docs/clients.md)
    embeddings = langchain_openai.OpenAIEmbeddings(
        model="embed", base_url=switchyard.base_url, api_key=API_KEY, check_embedding_ctx_length=False, max_retries=0
    )
    texts = ["first text", "second text"]
    np.testing.assert_allclose(embeddings.embed_documents(texts), [fake_vector(t) for t in texts], atol=1e-6)
    np.testing.assert_allclose(embeddings.embed_query("a question"), fake_vector("a question"), atol=1e-6)
