"""LoRA adapters on the embedded engine, trained here with peft on the tiny model, served by the proxy
and asked through the real `openai` SDK."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from switchyard.backends.embedded import models
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until
from tests.tiny_model import build_tiny_model

# peft asks transformers a deprecated question when it wraps a model; not ours to answer
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
ANSWERS = {"adapter-a": "paris is the capital of france", "adapter-b": "one two three four"}  # what each learns
MAX_TOKENS = 12
TIMEOUT_S = 60  # bounds a hang only


@dataclass
class Trained:
    model_dir: Path
    tokenizer: Any
    prompt_ids: list[int]  # MESSAGES under the chat template
    folders: dict[str, Path]
    reference: dict[str, list[int]]  # greedy token ids: peft's for each adapter, transformers' for the base


def _train_adapter(model_dir: Path, prompt_ids: list[int], answer: str, folder: Path, tokenizer) -> None:
    """A LoRA on q_proj and v_proj trained (a few steps, a high learning rate) to answer `answer`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(base, config)
    answer_ids = tokenizer.encode(answer) + [tokenizer.eos_token_id]
    input_ids = torch.tensor([prompt_ids + answer_ids])
    labels = torch.tensor([[-100] * len(prompt_ids) + answer_ids])
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    for _ in range(60):
        model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)


def _greedy(model, prompt_ids: list[int], pad_token_id: int) -> list[int]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=pad_token_id,
        )
    return out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Iterator[Trained]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # One torch thread: a model this small trains and answers many times faster than on cores it shares.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora")
    model_dir = build_tiny_model(root / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    folders, reference = {}, {}
    for name, answer in ANSWERS.items():
        folders[name] = root / name
        _train_adapter(model_dir, prompt_ids, answer, folders[name], tokenizer)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        reference[name] = _greedy(
            PeftModel.from_pretrained(base, folders[name]).eval(), prompt_ids, tokenizer.eos_token_id
        )
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    reference["tiny"] = _greedy(base, prompt_ids, tokenizer.eos_token_id)
    # The same adapter saved for a LoRA of another rank: its weights do not fit the layers it makes.
    folders["adapter-unfit"] = root / "adapter-unfit"
    shutil.copytree(folders["adapter-a"], folders["adapter-unfit"])
    config_file = folders["adapter-unfit"] / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "r": 4}))
    yield Trained(model_dir, tokenizer, prompt_ids, folders, reference)
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def proxy(trained):
    adapters = [{"name": name, "path": str(folder)} for name, folder in trained.folders.items()]
    adapters.append({"name": "adapter-missing", "path": str(trained.model_dir / "nowhere")})
    # the batch path: `_hold_at_token` holds a request by stopping the batch's thread at a token
    # (a lone request on the single-stream path would not stop there)
    engine = {
        "num_blocks": 64,
        "page_size": 16,
        "context_window": 256,
        "max_loras": 1,
        "threads": 1,
        "single_stream": False,
    }
    model = {"name": "tiny", "backend": "embedded", "model": str(trained.model_dir), "engine": engine}
    settings = Settings(models=[{**model, "adapters": adapters}], upstream={"health_interval_s": 0.2})
    app = create_app(settings)
    with serve_in_thread(app) as url:
        assert wait_until(
            lambda: httpx.get(url + "/health/ready", timeout=TIMEOUT_S).json()["models"]["tiny"], TIMEOUT_S
        )
        yield url, app


@pytest.fixture
def sdk(proxy):
    with openai.OpenAI(base_url=proxy[0] + "/v1", api_key="k", max_retries=0) as client:
        yield client


def _pool(app):
    return app.state.services.registry.get("tiny").backend.adapter_pool


def _ask(sdk, model: str, **options):
    return sdk.chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, logprobs=True, **options
    )


def _assert_answers_as(reply, trained: Trained, model: str) -> None:
    """Token for token: the reply's tokens are the reference's of `model` (up to its EOS, which is no text)."""
    tokenizer, reference = trained.tokenizer, trained.reference[model]
    ends = tokenizer.eos_token_id in reference
    text_ids = reference[: reference.index(tokenizer.eos_token_id)] if ends else reference
    choice = reply.choices[0]
    assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([i]) for i in text_ids]
    assert choice.finish_reason == ("stop" if ends else "length")
    assert reply.usage.completion_tokens == len(reference)
    assert reply.usage.prompt_tokens > 0


def test_the_adapter_answers_as_peft_does_and_unlike_the_base_model(sdk, trained):
    adapted = _ask(sdk, "adapter-a")
    assert adapted.model == "adapter-a"
    _assert_answers_as(adapted, trained, "adapter-a")
    assert adapted.choices[0].message.content.startswith(ANSWERS["adapter-a"])
    base = _ask(sdk, "tiny")
    _assert_answers_as(base, trained, "tiny")
    assert base.choices[0].message.content != adapted.choices[0].message.content


def test_the_base_model_is_untouched_by_its_adapters(sdk, trained, proxy):
    _ask(sdk, "adapter-b")
    _ask(sdk, "adapter-a")
    assert _pool(proxy[1]).num_loads["adapter-a"] >= 1
    _assert_answers_as(_ask(sdk, "tiny"), trained, "tiny")


def test_stream_and_completions_through_the_adapter(sdk, trained):
    reply = _ask(sdk, "adapter-b")
    whole = reply.choices[0].message.content
    assert whole.startswith(ANSWERS["adapter-b"])
    chunks = list(
        sdk.chat.completions.create(
            model="adapter-b",
            messages=MESSAGES,
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == len(trained.reference["adapter-b"])
    completion = sdk.completions.create(
        model="adapter-b", prompt=trained.prompt_ids, temperature=0, max_tokens=MAX_TOKENS, logprobs=1
    )
    assert completion.choices[0].text == whole
    assert completion.choices[0].finish_reason == reply.choices[0].finish_reason
    assert completion.usage.completion_tokens == reply.usage.completion_tokens


def test_models_lists_the_adapters_under_their_base(sdk):
    cards = {m.id: m for m in sdk.models.list().data}
    assert cards["adapter-a"].parent == "tiny"  # type: ignore[attr-defined]
    assert cards["adapter-b"].parent == "tiny"  # type: ignore[attr-defined]


def test_least_recently_used_adapter_makes_room(sdk, trained, proxy):
    pool = _pool(proxy[1])
    _ask(sdk, "adapter-a")
    assert pool.loaded == ["adapter-a"]
    engine_a = pool.engine_of("adapter-a")
    _assert_answers_as(_ask(sdk, "adapter-b"), trained, "adapter-b")
    assert pool.loaded == ["adapter-b"]
    assert not engine_a.is_running
    _assert_answers_as(_ask(sdk, "adapter-a"), trained, "adapter-a")
    assert pool.loaded == ["adapter-a"]


def _hold_at_token(monkeypatch, num_tokens: int) -> threading.Event:
    """Any engine's batching thread stops at a request's `num_tokens`-th token (before sending it)
    until the returned event is set: the request stays in flight however fast the model is. Patched on
    the class, not on one engine: an adapter may be loaded again, as a new engine, between a test's
    warm-up and its request (an earlier test's request still waiting for a slot takes it meanwhile)."""
    from switchyard.backends.embedded.engine import EmbeddedEngine

    release, record_choice, num_chosen = threading.Event(), EmbeddedEngine.record_choice, Counter[str]()

    def record_then_hold(engine, request_id, choice) -> None:
        record_choice(engine, request_id, choice)
        num_chosen[request_id] += 1
        if num_chosen[request_id] >= num_tokens:
            release.wait(TIMEOUT_S)

    monkeypatch.setattr(EmbeddedEngine, "record_choice", record_then_hold)
    return release


def test_an_adapter_answering_is_not_unloaded(sdk, trained, proxy, monkeypatch):
    pool = _pool(proxy[1])
    _ask(sdk, "adapter-a")
    release = _hold_at_token(monkeypatch, 1)
    with ThreadPoolExecutor(2) as threads:
        try:
            held = threads.submit(_ask, sdk, "adapter-a")
            assert wait_until(lambda: (e := pool.engine_of("adapter-a")) and e.num_reserved_blocks > 0, TIMEOUT_S)
            engine_a = pool.engine_of("adapter-a")
            other = threads.submit(_ask, sdk, "adapter-b")
            assert wait_until(lambda: pool.num_waiting_for_room == 1, TIMEOUT_S)
            assert pool.loaded == ["adapter-a"] and engine_a.is_running
        finally:
            release.set()
        _assert_answers_as(held.result(TIMEOUT_S), trained, "adapter-a")
        _assert_answers_as(other.result(TIMEOUT_S), trained, "adapter-b")
    assert pool.loaded == ["adapter-b"]


def test_a_client_that_leaves_frees_the_adapter(sdk, trained, proxy, monkeypatch):
    url, app = proxy
    pool = _pool(app)
    _ask(sdk, "adapter-a")
    release = _hold_at_token(monkeypatch, 2)
    # greedy: sampled at the default temperature the tiny adapter may end at its first token (EOS),
    # and whether it did depended on the random state the tests before it left
    body = {
        "model": "adapter-a",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "temperature": 0,
    }
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=TIMEOUT_S) as response:
            data_lines = (line for line in response.iter_lines() if line.startswith("data: "))
            next(data_lines), next(data_lines)  # the role, then the first token
            engine_a = pool.engine_of("adapter-a")  # the engine holding it at its second token
            assert engine_a is not None and engine_a.num_reserved_blocks > 0
        assert wait_until(lambda: engine_a.num_reserved_blocks == 0, TIMEOUT_S)
    finally:
        release.set()
    # No longer in flight: it makes room for the other adapter at once.
    _assert_answers_as(_ask(sdk, "adapter-b"), trained, "adapter-b")
    assert pool.loaded == ["adapter-b"]


async def test_concurrent_first_requests_load_the_adapter_once(proxy, trained, monkeypatch):
    url, app = proxy
    pool = _pool(app)
    num_requests = 4
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as sdk:

        async def ask(model: str):
            return await sdk.chat.completions.create(
                model=model, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, logprobs=True
            )

        await ask("adapter-b")  # with one slot, adapter-a is not loaded now
        assert "adapter-a" not in pool.loaded
        num_loads = pool.num_loads["adapter-a"]
        # The load waits until every request has asked the pool for the adapter.
        asked, use, load = [], pool.use, models.load_adapter_model

        def use_counted(name, source):
            asked.append(name)
            return use(name, source)

        def load_once_all_asked(base_model, folder):
            assert wait_until(lambda: asked.count("adapter-a") >= num_requests, TIMEOUT_S)
            return load(base_model, folder)

        monkeypatch.setattr(pool, "use", use_counted)
        monkeypatch.setattr(models, "load_adapter_model", load_once_all_asked)
        replies = await asyncio.gather(*(ask("adapter-a") for _ in range(num_requests)))
    assert pool.num_loads["adapter-a"] == num_loads + 1
    for reply in replies:
        _assert_answers_as(reply, trained, "adapter-a")


@pytest.mark.parametrize(
    ("adapter", "words"), [("adapter-missing", "not a LoRA adapter folder"), ("adapter-unfit", "size mismatch")]
)
def test_an_adapter_that_cannot_load_is_a_503_naming_it(sdk, proxy, adapter, words):
    with pytest.raises(openai.InternalServerError) as info:
        _ask(sdk, adapter)
    assert info.value.status_code == 503
    message = info.value.response.json()["error"]["message"]
    assert adapter in message and words in message
    ready = httpx.get(proxy[0] + "/health/ready").json()["models"]
    assert ready[adapter] is False and ready["tiny"] is True
