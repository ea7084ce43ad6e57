"""`switchyard serve` with no config file and provider keys in the environment: the built-in default
adds their models as the tier `commercial`, and `auto` and the cascade route between SmolLM2 on the
embedded engine and the commercial model, which is the fake OpenAI (or Anthropic) API at the
provider's base URL variable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import closed_port
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, PROCESS_BOUND_S, wait_until

pytestmark = pytest.mark.slow  # a `switchyard serve` process that loads SmolLM2 twice, MiniLM and the classifier

OPENAI_KEY, ANTHROPIC_KEY = "sk-openai-test-key", "sk-ant-test-key"
# The shipped classifier's scores, far enough from the balanced threshold (0.194) on either side
EASY = "What is the capital of France?"  # 0.163: local-small, whose answer the cascade accepts (-0.39 >= -0.88)
HARD = (  # 0.225: the commercial tier
    "A store sells pens at 3 for $2 and notebooks at $4.50 each. Maria buys 12 pens and 5 notebooks "
    "and pays with a $50 bill. How much change does she get? Show your work."
)
UNSURE = "Continue: 7 3 9 1 4 8 2"  # SmolLM2's first tokens are unsure (about -1.2 < -0.88): it escalates


@dataclass
class Served:
    base_url: str
    openai_url: str
    anthropic_url: str
    gpt: FakeState
    claude: AnthropicState
    log: Path  # stderr: the start lines
    requests_log: Path  # stdout: the request log

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="sk-anything", max_retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("serve")  # the working directory: no ./switchyard.yaml in it
    gpt, claude = FakeState(), AnthropicState()
    with ExitStack() as stack:
        openai_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(gpt)))
        anthropic_url = stack.enter_context(serve_in_thread(FakeAnthropicUpstream(claude)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
        env |= {
            "OPENAI_API_KEY": OPENAI_KEY,
            "OPENAI_BASE_URL": openai_url + "/v1",
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
            "ANTHROPIC_BASE_URL": anthropic_url,
            "SWITCHYARD__BILLING__LEDGER_PATH": str(folder / "usage.db"),
            "SWITCHYARD__BILLING__REDIS_URL": "none",  # no private Valkey: batches are not what this tests
            "SWITCHYARD__ROUTING__AUTO__DEADLINE_MS": "60000",  # a busy machine's late score would route to small
        }
        port = closed_port()
        log, requests_log = folder / "serve.log", folder / "requests.jsonl"
        err, out = stack.enter_context(log.open("wb")), stack.enter_context(requests_log.open("wb"))
        command = [sys.executable, "-m", "switchyard", "serve", "--port", str(port)]
        process = stack.enter_context(subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=err))
        base_url = f"http://127.0.0.1:{port}"
        try:

            def is_ready() -> bool:
                assert process.poll() is None, log.read_text()
                try:
                    return httpx.get(base_url + "/health/ready", timeout=30).status_code == 200
                except httpx.TransportError:
                    return False

            assert wait_until(is_ready, timeout_s=MODEL_LOAD_BOUND_S, interval_s=0.2), log.read_text()
            yield Served(base_url, openai_url, anthropic_url, gpt, claude, log, requests_log)
        finally:
            process.terminate()
            process.wait(timeout=PROCESS_BOUND_S)


def test_models_list_the_commercial_tier_and_what_auto_and_cascade_route_between(served):
    cards = {card["id"]: card for card in httpx.get(served.base_url + "/v1/models").json()["data"]}
    assert {name: cards[name]["tier"] for name in ("local-small", "gpt-4.1-mini", "claude-haiku-4-5")} == {
        "local-small": "small",
        "gpt-4.1-mini": "commercial",
        "claude-haiku-4-5": "commercial",
    }
    assert cards["gpt-4.1"]["tier"] is None and cards["claude-sonnet-4-5"]["tier"] is None  # by name only
    assert all(cards[name]["ready"] for name in ("gpt-4.1-mini", "claude-haiku-4-5", "auto", "cascade"))
    assert cards["auto"]["tiers"] == {"small": ["local-small"], "commercial": ["gpt-4.1-mini", "claude-haiku-4-5"]}
    assert cards["cascade"]["ladder"] == ["local-small", "gpt-4.1-mini"]
    assert cards["local-small"]["tiers"] is None and cards["local-small"]["ladder"] is None


def test_the_start_log_names_the_live_tiers_and_their_variables_but_no_key(served):
    text = served.log.read_text()
    assert (
        "OpenAI: gpt-4.1-mini (tier commercial) and gpt-4.1 through LiteLLM, key from OPENAI_API_KEY, "
        f"base URL {served.openai_url}/v1 from OPENAI_BASE_URL"
    ) in text
    assert f"key from ANTHROPIC_API_KEY, base URL {served.anthropic_url} from ANTHROPIC_BASE_URL" in text
    assert "auto routes between small: local-small; commercial: gpt-4.1-mini, claude-haiku-4-5" in text
    assert "cascade: local-small -> gpt-4.1-mini" in text
    for key in (OPENAI_KEY, ANTHROPIC_KEY):
        assert key not in text


def test_auto_answers_an_easy_prompt_locally_and_a_hard_one_with_the_commercial_model(served):
    with served.sdk() as sdk:
        easy = sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": EASY}], temperature=0, max_tokens=24
        )
        num_sent = len(served.gpt.records)
        hard = sdk.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": HARD}], max_tokens=24
        )
    assert easy.headers["x-switchyard-model"] == "local-small"
    assert re.fullmatch(r"auto:classifier=0\.1\d+<0\.194->small", easy.headers["x-switchyard-route"])
    assert "Paris" in easy.parse().choices[0].message.content
    assert hard.headers["x-switchyard-model"] == "gpt-4.1-mini"
    assert hard.headers["x-switchyard-backend"] == "litellm#0"
    assert re.fullmatch(r"auto:classifier=0\.2\d+>=0\.194->commercial", hard.headers["x-switchyard-route"])
    assert hard.parse().choices[0].message.content == "alpha bravo charlie delta echo "
    [sent] = served.gpt.records[num_sent:]  # at OPENAI_BASE_URL, with OPENAI_API_KEY, as gpt-4.1-mini
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent.body["model"] == "gpt-4.1-mini"
    assert sent.body["messages"][-1]["content"] == HARD


def test_the_cascade_escalates_from_local_small_to_the_commercial_model_when_unsure(served):
    with served.sdk() as sdk:
        sure = sdk.chat.completions.with_raw_response.create(
            model="cascade", messages=[{"role": "user", "content": EASY}], temperature=0, max_tokens=24
        )
        unsure = sdk.chat.completions.with_raw_response.create(
            model="cascade", messages=[{"role": "user", "content": UNSURE}], temperature=0, max_tokens=24
        )
    assert sure.headers["x-switchyard-model"] == "local-small"
    assert re.fullmatch(r"local-small\(-0\.\d+>=-0\.88\)", sure.headers["x-switchyard-cascade"])
    assert unsure.headers["x-switchyard-model"] == "gpt-4.1-mini"
    assert re.fullmatch(r"local-small\(-\d\.\d+<-0\.88\)->gpt-4.1-mini", unsure.headers["x-switchyard-cascade"])
    assert unsure.parse().choices[0].message.content == "alpha bravo charlie delta echo "
    assert served.gpt.records[-1].body["messages"][-1]["content"] == UNSURE


def test_the_second_provider_answers_by_name_and_when_the_first_fails(served):
    with served.sdk() as sdk:
        named = sdk.chat.completions.create(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}])
        assert named.model == "claude-haiku-4-5" and named.choices[0].message.content == "bonjour from claude "
        assert served.claude.requests[-1]["model"] == "claude-haiku-4-5"  # at ANTHROPIC_BASE_URL, with its key
        assert served.claude.headers[-1]["x-api-key"] == ANTHROPIC_KEY
        num_to_claude = len(served.claude.requests)
        failing = {"failure": "500", "fail_times": served.gpt.num_requests + 2}  # both attempts at gpt-4.1-mini
        served.gpt.behaviour = served.gpt.behaviour.updated(failing)
        try:
            fallen_back = sdk.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": HARD}], max_tokens=24
            )
        finally:
            served.gpt.behaviour = served.gpt.behaviour.updated({"failure": None, "fail_times": None})
    assert fallen_back.headers["x-switchyard-model"] == "claude-haiku-4-5"
    assert fallen_back.headers["x-switchyard-route"].endswith("->commercial")
    assert len(served.claude.requests) == num_to_claude + 1
