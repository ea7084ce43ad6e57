"""`/v1/embeddings` through the real `openai` SDK: the embedded MiniLM, an OpenAI-compatible server
and LiteLLM, each metered, budgeted and refused like a completion."""

from __future__ import annotations

import asyncio
import base64
import struct
from contextlib import ExitStack

import httpx
import numpy as np
import openai
import pytest

from switchyard.backends.defaults import load_settings
from switchyard.backends.embedded.minilm import shared_minilm
from switchyard.billing.report import build_report
from switchyard.classifier.embedder import Embedder
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState, fake_vector
from tests.fakes.server import serve_in_thread
from tests.helpers import MODEL_LOAD_BOUND_S, read_ledger, wait_for_records, wait_until

TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew by four percent.", "def add(a, b): return a + b"]
EMBED_PRICE = {"input_usd_per_mtok": 0.02, "output_usd_per_mtok": 0.0}
KEYS = {"search": "sk-search", "broke": "sk-broke"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = FakeState()
    tmp = tmp_path_factory.mktemp("embeddings")
    with ExitStack() as stack:
        upstream = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(state))) + "/v1"
        settings = Settings(
            models=[
                {"name": "local-embed", "backend": "embedded", "model": "all-minilm-l6-v2", "price": EMBED_PRICE},
                {
                    "name": "remote-embed",
                    "kind": "embedding",
                    "base_url": upstream,
                    "upstream_model": "bge-small",
                    "price": EMBED_PRICE,
                },
                {
                    "name": "provider-embed",
                    "kind": "embedding",
                    "backend": "litellm",
                    "litellm_model": "openai/text-embedding-3-small",
                    "base_url": upstream,
                    "api_key": "sk-upstream",
                },
                {"name": "chat", "base_url": upstream},
            ],
            teams={
                "search": {"api_keys": [KEYS["search"]]},
                "broke": {"api_keys": [KEYS["broke"]], "budget_usd_per_day": 0.0},
            },
            server={"metrics_public": True},  # scraped without a token
            billing={"ledger_path": tmp / "usage.db"},
            upstream={"health_interval_s": 0.2},
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        assert wait_until(lambda: _ready(base, "local-embed"), timeout_s=MODEL_LOAD_BOUND_S)  # bounds a hang only
        yield base, state, app


def _ready(base: str, model: str) -> bool:
    cards = httpx.get(base + "/v1/models", headers={"authorization": f"Bearer {KEYS['search']}"}).json()["data"]
    return any(card["id"] == model and card["ready"] for card in cards)


@pytest.fixture
def sdk(served):
    with openai.OpenAI(base_url=served[0] + "/v1", api_key=KEYS["search"], max_retries=0, timeout=60) as client:
        yield client


def _reference(texts: list[str]) -> np.ndarray:
    return shared_minilm().encode(texts, normalize_embeddings=True)


def test_the_embedded_minilm_answers_as_sentence_transformers_does(sdk):
    reply = sdk.embeddings.create(model="local-embed", input=TEXTS, encoding_format="float")
    vectors = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert [item.index for item in reply.data] == [0, 1, 2]
    np.testing.assert_allclose(vectors, _reference(TEXTS), atol=1e-5)
    tokenizer = shared_minilm().tokenizer
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
    assert reply.model == "local-embed"


def test_base64_and_token_ids_give_the_same_vectors(sdk, served):
    # the SDK asks for base64 unless told otherwise, and decodes it
    decoded = sdk.embeddings.create(model="local-embed", input=TEXTS[0]).data[0].embedding
    np.testing.assert_allclose(decoded, _reference(TEXTS[:1])[0], atol=1e-5)
    ids = shared_minilm().tokenizer(TEXTS[1])["input_ids"]
    from_ids = sdk.embeddings.create(model="local-embed", input=[ids], encoding_format="float")
    np.testing.assert_allclose(from_ids.data[0].embedding, _reference(TEXTS[1:2])[0], atol=1e-5)
    assert from_ids.usage.prompt_tokens == len(ids)
    raw = httpx.post(
        served[0] + "/v1/embeddings",
        json={"model": "local-embed", "input": "hello", "encoding_format": "base64"},
        headers={"authorization": f"Bearer {KEYS['search']}"},
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    np.testing.assert_allclose(np.frombuffer(packed, dtype="<f4"), _reference(["hello"])[0], atol=1e-5)


async def test_concurrent_requests_each_get_their_own_rows(served):
    texts = [f"request number {i} is about topic {i * 7}" for i in range(12)]
    async with openai.AsyncOpenAI(base_url=served[0] + "/v1", api_key=KEYS["search"], max_retries=0) as client:
        replies = await asyncio.gather(
            *(client.embeddings.create(model="local-embed", input=[t], encoding_format="float") for t in texts)
        )
    got = np.array([reply.data[0].embedding for reply in replies], dtype=np.float32)
    np.testing.assert_allclose(got, _reference(texts), atol=1e-5)


def test_what_the_model_cannot_do_is_a_clear_400(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="local-embed", input="hi", dimensions=128)
    assert refused.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="local-embed", input="word " * 400)
    assert refused.value.body["code"] == "context_length_exceeded" and "256" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="local-embed", input=["fine", ""])
    assert refused.value.body["param"] == "input" and "input[1]" in refused.value.body["message"]
    assert len(sdk.embeddings.create(model="local-embed", input="hi", dimensions=384).data[0].embedding) == 384


def test_a_model_of_the_other_kind_is_a_400_naming_the_model(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="chat", input="hi")
    assert (refused.value.body["code"], refused.value.body["param"]) == ("unsupported_model", "model")
    assert "chat model" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="local-embed", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["code"] == "unsupported_model" and "/v1/embeddings" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model="auto", input="hi")
    assert refused.value.body["param"] == "model"


def test_an_openai_compatible_server_is_relayed(sdk, served):
    _, state, _ = served
    raw = sdk.embeddings.with_raw_response.create(model="remote-embed", input=TEXTS, encoding_format="float")
    reply = raw.parse()
    assert [item.embedding for item in reply.data] == [fake_vector(t) for t in TEXTS]
    assert reply.model == "remote-embed"
    assert raw.headers["x-switchyard-model"] == "remote-embed"
    assert raw.headers["x-switchyard-upstream-model"] == "bge-small"
    words = sum(len(t.split()) for t in TEXTS)
    assert reply.usage.prompt_tokens == words
    assert float(raw.headers["x-switchyard-cost-usd"]) == pytest.approx(words * 0.02 / 1e6)
    record = [r for r in state.records if r.path == "/v1/embeddings"][-1]
    assert record.body["model"] == "bge-small" and record.body["input"] == TEXTS
    # the SDK's own base64 round trip, through the proxy untouched
    decoded = sdk.embeddings.create(model="remote-embed", input="x y", dimensions=4).data[0].embedding
    np.testing.assert_allclose(decoded, fake_vector("x y", 4), atol=1e-6)


def test_litellm_embeds_with_the_provider(sdk, served):
    _, state, _ = served
    reply = sdk.embeddings.create(model="provider-embed", input=TEXTS[:2], encoding_format="float")
    np.testing.assert_allclose([item.embedding for item in reply.data], [fake_vector(t) for t in TEXTS[:2]], atol=1e-6)
    assert reply.model == "provider-embed"
    record = [r for r in state.records if r.path == "/v1/embeddings"][-1]
    assert record.body["model"] == "text-embedding-3-small"
    assert record.headers["authorization"] == "Bearer sk-upstream"
    decoded = sdk.embeddings.create(model="provider-embed", input="x y").data[0].embedding  # base64 both ways
    np.testing.assert_allclose(decoded, fake_vector("x y"), atol=1e-6)


def test_embeddings_are_metered_and_budgeted_like_completions(sdk, served):
    base, _, app = served
    raw = sdk.embeddings.with_raw_response.create(model="local-embed", input=TEXTS, encoding_format="float")
    tokens = raw.parse().usage.prompt_tokens
    [record] = wait_for_records(app, 1, request_id=raw.headers["x-request-id"])
    assert (record.model, record.status, record.team) == ("local-embed", "completed", "search")
    assert (record.prompt_tokens, record.completion_tokens) == (tokens, 0)
    assert record.cost_usd == pytest.approx(tokens * 0.02 / 1e6) and not record.is_estimated
    usage = httpx.get(
        base + "/v1/usage", params={"group_by": "model"}, headers={"authorization": f"Bearer {KEYS['search']}"}
    ).json()
    rows = [row for row in usage["data"] if row.get("model") == "local-embed"]
    assert rows and rows[0]["prompt_tokens"] >= tokens and rows[0]["requests"] >= 1
    with openai.OpenAI(base_url=base + "/v1", api_key=KEYS["broke"], max_retries=0) as broke:
        with pytest.raises(openai.RateLimitError) as refused:
            broke.embeddings.create(model="local-embed", input="anything")
    assert "budget" in refused.value.body["message"]
    metrics = httpx.get(base + "/metrics").text
    assert 'switchyard_requests_total{backend="embedded#0",model="local-embed"' in metrics
    records = read_ledger(app)

    async def batches():
        yield records

    report = asyncio.run(build_report(batches()))
    [row] = [r for r in report.tables["models"].records() if r["model"] == "local-embed"]
    assert row["hosting"] == "self-hosted" and row["completion_tokens"] == 0
    assert row["prompt_tokens"] == sum(r.prompt_tokens for r in records if r.model == "local-embed")


def test_models_list_says_which_models_embed(sdk):
    cards = {card.id: card for card in sdk.models.list().data}
    assert cards["local-embed"].kind == "embedding" and cards["local-embed"].context_window == 256
    assert cards["chat"].kind == "chat"


def test_the_default_config_serves_local_embed_and_the_classifier_shares_its_model():
    settings = load_settings(None)
    [embed] = [m for m in settings.models if m.name == "local-embed"]
    assert (embed.kind, embed.model) == ("embedding", "all-minilm-l6-v2")
    assert Embedder()._load() is shared_minilm()


def test_a_packed_float32_vector_is_what_base64_means():
    # what the base64 answers above are checked against: OpenAI's little-endian float32
    assert base64.b64decode(base64.b64encode(struct.pack("<2f", 1.0, -2.0))) == np.array([1, -2], "<f4").tobytes()


def test_tokenize_counts_what_embedding_the_input_costs(sdk, served):
    base = served[0]
    headers = {"authorization": f"Bearer {KEYS['search']}"}
    counted = httpx.post(base + "/v1/tokenize", json={"model": "local-embed", "prompt": TEXTS[1]}, headers=headers)
    body = counted.json()
    ids = shared_minilm().tokenizer(TEXTS[1])["input_ids"]
    assert (body["count"], body["tokens"], body["max_model_len"]) == (len(ids), ids, 256)
    assert body["count"] == sdk.embeddings.create(model="local-embed", input=TEXTS[1]).usage.prompt_tokens
    assert body["estimated_cost_usd"]["min"] == pytest.approx(len(ids) * 0.02 / 1e6)
    text = httpx.post(base + "/v1/detokenize", json={"model": "local-embed", "tokens": ids}, headers=headers).json()
    assert text["prompt"] == "[CLS] " + TEXTS[1].lower() + " [SEP]"
    refused = httpx.post(
        base + "/v1/tokenize",
        json={"model": "local-embed", "messages": [{"role": "user", "content": "hi"}]},
        headers=headers,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
