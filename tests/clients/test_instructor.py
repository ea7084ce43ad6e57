"""instructor (`instructor.from_openai`, `response_model=`) in its tools and JSON-schema modes.

instructor 1.17.0 (the newest) pins jiter<0.15, and the openai 3.x SDK in .venv needs jiter>=0.16:
`make test-clients-openai2` runs this file in an env of its own, with openai 2.x (tests/clients/own_env.py);
in .venv it skips."""

from __future__ import annotations

import openai
import pytest

from tests.clients.conftest import API_KEY, PROMPT, Verdict
from tests.clients.own_env import import_client

instructor = import_client("instructor", "instructor pins jiter<0.15; the openai 3.x SDK here needs jiter>=0.16")

ASK = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def client(switchyard):
    with openai.OpenAI(base_url=switchyard.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


@pytest.mark.parametrize("mode", ("TOOLS", "JSON_SCHEMA"))
@pytest.mark.parametrize("model", ("gpt", "gpt-litellm", "claude"))
def test_response_model(client, model, mode):
    structured = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    verdict = structured.chat.completions.create(model=model, messages=ASK, response_model=Verdict, max_retries=0)
    assert verdict.model_dump() == {"answer": "yes", "sure": True}  # a subclass instructor makes of Verdict


def test_response_model_through_auto_reaches_a_model_that_calls_tools(client):
    structured = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    verdict = structured.chat.completions.create(model="auto", messages=ASK, response_model=Verdict, max_retries=0)
    assert verdict.model_dump() == {"answer": "yes", "sure": True}  # a subclass instructor makes of Verdict


def test_response_model_on_the_embedded_model_in_json_schema_mode(client):
    structured = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
    verdict = structured.chat.completions.create(
        model="tiny", messages=ASK, response_model=Verdict, max_retries=0, max_tokens=64
    )
    assert isinstance(verdict, Verdict)
