"""Prefix caching behind the proxy, on a tiny random model, through the real `openai` SDK: cached
prompt tokens in `usage`, priced at `cached_input_usd_per_mtok`, counted in `/metrics`."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, wait_until
from tests.tiny_model import CORPUS, build_tiny_model

PAGE = 16
PRICE = {"input_usd_per_mtok": 1000.0, "output_usd_per_mtok": 2000.0, "cached_input_usd_per_mtok": 100.0}
ENGINE = {"num_blocks": 64, "page_size": PAGE, "context_window": 1024, "default_max_tokens": 12}
# A request alone runs on the single-stream path, which keeps the last request's KV; `tiny-batch`
# always runs in the batch, whose cache keeps whole blocks of many prompts.
MODELS = {
    "tiny": ENGINE,
    "tiny-batch": {**ENGINE, "single_stream": False},
    "tiny-off": {**ENGINE, "single_stream": False, "prefix_caching": False},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    settings = Settings(
        models=[
            {"name": name, "backend": "embedded", "model": str(model_dir), "engine": engine, "price": PRICE}
            for name, engine in MODELS.items()
        ]
    )
    with serve_in_thread(create_app(settings)) as url:
        # bounds a hang only: loading even a tiny model takes long on a busy machine
        assert wait_until(
            lambda: all(m["ready"] for m in httpx.get(url + "/v1/models", timeout=60).json()["data"]),
            timeout_s=MODEL_LOAD_BOUND_S,
        )
        yield url, AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def sdk(served):
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="k", max_retries=0) as client:
        yield client


def _messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def _system(seed: int) -> str:
    return f"rule {seed}: " + " ".join(CORPUS[seed : seed + 12])


def _num_common(tokenizer, a: list[dict[str, str]], b: list[dict[str, str]]) -> int:
    ids_a, ids_b = (tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False) for m in (a, b))
    return next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)


def _expected_cost_usd(usage) -> float:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return Price(**PRICE).cost_usd(usage.prompt_tokens, usage.completion_tokens, cached or 0)


@pytest.mark.parametrize(("model", "reuses"), [("tiny", "tokens"), ("tiny-batch", "blocks")])
def test_the_second_request_sharing_a_system_prompt_reports_and_pays_less_for_it(served, sdk, model, reuses):
    _, tokenizer = served
    system = _system(1 if reuses == "tokens" else 2)
    first, second = _messages(system, "one two three"), _messages(system, "paris is the capital")
    raws = [
        sdk.chat.completions.with_raw_response.create(model=model, messages=m, temperature=0, max_tokens=8)
        for m in (first, second)
    ]
    replies = [raw.parse() for raw in raws]
    assert replies[0].usage.prompt_tokens_details is None  # nothing reused: the field is left out
    num_common = _num_common(tokenizer, first, second)
    assert num_common > 3 * PAGE
    expected = num_common if reuses == "tokens" else num_common // PAGE * PAGE
    assert replies[1].usage.prompt_tokens_details.cached_tokens == expected
    for raw, reply in zip(raws, replies, strict=True):
        assert float(raw.headers["x-switchyard-cost-usd"]) == pytest.approx(_expected_cost_usd(reply.usage), abs=1e-8)
    full_price = Price(PRICE["input_usd_per_mtok"], PRICE["output_usd_per_mtok"])
    assert float(raws[1].headers["x-switchyard-cost-usd"]) < full_price.cost_usd(
        replies[1].usage.prompt_tokens, replies[1].usage.completion_tokens
    )
    # The same greedy answer as with the cache off.
    off = sdk.chat.completions.create(model="tiny-off", messages=second, temperature=0, max_tokens=8)
    assert off.choices[0].message.content == replies[1].choices[0].message.content
    assert off.usage.prompt_tokens_details is None


def test_a_streams_usage_chunk_reports_cached_tokens_and_their_price(sdk):
    system = _system(3)
    sdk.chat.completions.create(model="tiny-batch", messages=_messages(system, "one two"), max_tokens=4)
    chunks = list(
        sdk.chat.completions.create(
            model="tiny-batch",
            messages=_messages(system, "a stitch in time"),
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens >= 3 * PAGE
    assert usage.model_extra["cost_usd"] == pytest.approx(_expected_cost_usd(usage), abs=1e-8)


def test_metrics_count_the_prompt_tokens_looked_up_and_found(served, sdk):
    base, _ = served

    def counts() -> dict[tuple[str, str], float]:
        text = httpx.get(base + "/metrics", timeout=30).text
        wanted = ("queries", "hits", "tokens")
        families = list(text_string_to_metric_families(text))
        engine = {
            (s.name.removeprefix("switchyard_engine_prefix_cache_").removesuffix("_total"), s.labels["model"]): s.value
            for family in families
            if family.name.startswith("switchyard_engine_prefix_cache_")
            for s in family.samples
            if s.name.removeprefix("switchyard_engine_prefix_cache_").removesuffix("_total") in wanted
        }
        metered = {  # the proxy's metering of the answers' usage, by model and team
            ("metered_read", s.labels["model"]): s.value
            for family in families
            if family.name == "switchyard_cache_tokens"
            for s in family.samples
            if s.name == "switchyard_cache_tokens_total" and s.labels["kind"] == "read"
        }
        return engine | metered

    before = counts()
    assert ("queries", "tiny-off") not in before  # only models with prefix caching on
    system = _system(4)
    usages = [
        sdk.chat.completions.create(model="tiny-batch", messages=_messages(system, q), max_tokens=4).usage
        for q in ("one", "two", "three")
    ]
    after = counts()
    num_prompt = sum(u.prompt_tokens for u in usages)
    num_cached = sum(u.prompt_tokens_details.cached_tokens for u in usages if u.prompt_tokens_details)
    assert num_cached >= 2 * 3 * PAGE
    assert after[("queries", "tiny-batch")] - before[("queries", "tiny-batch")] == num_prompt
    assert after[("hits", "tiny-batch")] - before[("hits", "tiny-batch")] == num_cached
    assert after[("metered_read", "tiny-batch")] - before.get(("metered_read", "tiny-batch"), 0) == num_cached
    assert after[("tokens", "tiny-batch")] >= 3 * PAGE  # the system prompt's blocks, kept for reuse


def test_through_the_messages_api_the_hits_are_cache_read_input_tokens(served):
    """Anthropic's usage splits the prompt: `input_tokens` not read from the cache, and the engine's
    prefix-cache hits as `cache_read_input_tokens` (the same count the chat API's usage gives)."""
    import anthropic

    base, tokenizer = served
    system = _system(4)
    first, second = _messages(system, "one two three"), _messages(system, "paris is the capital")
    with anthropic.Anthropic(base_url=base, api_key="k", max_retries=0) as client:
        usages = [
            client.messages.create(
                model="tiny-batch", system=m[0]["content"], messages=m[1:], max_tokens=4, extra_body={"temperature": 0}
            ).usage
            for m in (first, second)
        ]
    # (the first may reuse blocks of earlier tests' prompts too: the batch's cache is the model's)
    cached = _num_common(tokenizer, first, second) // PAGE * PAGE
    assert cached >= 3 * PAGE and usages[1].cache_read_input_tokens >= cached
    for usage, m in zip(usages, (first, second), strict=True):
        num_prompt = len(tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False))
        assert usage.input_tokens + usage.cache_read_input_tokens == num_prompt
        assert usage.cache_creation_input_tokens == 0
