"""LoRA adapters on vLLM replicas, loaded at run time: placement, LRU, one load at a time, failures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from switchyard.backends.vllm import VLLMBackend, VLLMReplica
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeState
from tests.fakes.server import serve_in_thread
from tests.fakes.vllm_upstream import FakeLoRA, FakeVLLMUpstream
from tests.helpers import wait_until

TIMEOUT_S = 30  # bounds a hang only
HOUR_S = 3600  # no scrape or probe after the first ones: what a replica lists changes only when a test says
MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass
class Fleet:
    base_url: str  # the proxy's, ending in /v1
    app: Any  # the proxy's FastAPI app
    loras: list[FakeLoRA]
    states: list[FakeState]

    @property
    def backend(self) -> VLLMBackend:
        backend = self.app.state.services.registry.get("base").backend
        assert isinstance(backend, VLLMBackend)
        return backend

    def num_in_flight(self, model: str) -> int:
        return self.app.state.services.executor.guards[model].num_in_flight

    def has_listed_twice(self) -> bool:
        """The start's scrape and the health watcher's first probe have each read every /v1/models."""
        return all(lora.num_listings >= 2 for lora in self.loras)


@contextmanager
def _fleet(loras: list[FakeLoRA], *, adapters: tuple[str, ...] = ("support",), max_loras: int = 4) -> Iterator[Fleet]:
    """A proxy over one fake vLLM replica per `loras`, serving model `base` and its `adapters`
    (adapter NAME at /adapters/NAME)."""
    states = [FakeState(model_id="base") for _ in loras]
    with ExitStack() as stack:
        urls = [
            stack.enter_context(serve_in_thread(FakeVLLMUpstream(state, lora=lora))) + "/v1"
            for state, lora in zip(states, loras, strict=True)
        ]
        model = {
            "name": "base",
            "backend": "vllm",
            "replicas": [{"base_url": url} for url in urls],
            "vllm": {"max_loras": max_loras, "metrics_interval_s": HOUR_S},
            "adapters": [{"name": name, "path": f"/adapters/{name}"} for name in adapters],
        }
        settings = Settings(models=[model], upstream={"health_interval_s": HOUR_S, "health_timeout_s": TIMEOUT_S})
        app = create_app(settings)
        base_url = stack.enter_context(serve_in_thread(app)) + "/v1"
        yield Fleet(base_url, app, loras, states)


def _loras(num: int, *paths: str) -> list[FakeLoRA]:
    return [FakeLoRA(paths={f"/adapters/{p}" for p in paths}) for _ in range(num)]


def _sdk(fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.base_url, api_key="k", max_retries=0, timeout=TIMEOUT_S)


def _ask(sdk: openai.OpenAI, model: str, *, stream: bool = False) -> str:
    """The label of the replica that answered; checks the answer is the adapter's."""
    if stream:
        with sdk.chat.completions.with_streaming_response.create(model=model, messages=MESSAGES, stream=True) as raw:
            chunks = list(raw.parse())
            assert {chunk.model for chunk in chunks} == {model}
            return raw.headers["x-switchyard-backend"]
    raw = sdk.chat.completions.with_raw_response.create(model=model, messages=MESSAGES)
    assert raw.parse().model == model
    return raw.headers["x-switchyard-backend"]


def _asked_for(state: FakeState) -> list[str]:
    return [record.body["model"] for record in state.records]


def test_an_adapter_is_loaded_on_one_replica_and_its_requests_go_there():
    with _fleet(_loras(2, "support")) as fleet, _sdk(fleet) as sdk:
        labels = {_ask(sdk, "support", stream=i % 2 == 1) for i in range(4)}
        backend = fleet.backend
        assert len(labels) == 1
        (label,) = labels
        holder = int(label.removeprefix("vllm#"))
        assert [lora.num_loads for lora in fleet.loras] == [1 if i == holder else 0 for i in range(2)]
        assert fleet.loras[holder].load_requests == ["support"]
        assert _asked_for(fleet.states[holder]) == ["support"] * 4  # vLLM's model field: the lora_name
        assert backend.lora.loaded_on("support") == [label]
        assert _ask(sdk, "base") in ("vllm#0", "vllm#1")  # the base model is still itself
        assert _asked_for(fleet.states[0]) + _asked_for(fleet.states[1]) == ["support"] * 4 + ["base"]


def test_an_adapter_a_replica_lists_at_start_is_used_without_a_load():
    loras = _loras(2, "support")
    loras[1].loaded["support"] = "/adapters/support"
    with _fleet(loras) as fleet, _sdk(fleet) as sdk:
        assert wait_until(lambda: fleet.backend.lora.loaded_on("support") == ["vllm#1"], TIMEOUT_S)
        assert [_ask(sdk, "support") for _ in range(3)] == ["vllm#1"] * 3
        assert [lora.load_requests for lora in fleet.loras] == [[], []]


def test_a_full_replica_unloads_its_least_recently_used_adapter():
    with _fleet(_loras(1, "a", "b", "c"), adapters=("a", "b", "c"), max_loras=2) as fleet, _sdk(fleet) as sdk:
        (lora,) = fleet.loras
        for model in ("a", "b", "a"):
            _ask(sdk, model)
        assert lora.unloaded == []
        _ask(sdk, "c")  # b was used less recently than a
        assert lora.unloaded == ["b"]
        assert set(lora.loaded) == {"a", "c"}
        _ask(sdk, "b")
        assert lora.unloaded == ["b", "a"]
        assert set(lora.loaded) == {"c", "b"}
        assert lora.load_requests == ["a", "b", "c", "b"]


async def test_an_adapter_with_a_request_in_flight_is_not_unloaded():
    gate = threading.Event()
    loras = _loras(1, "a", "b", "c")
    with _fleet(loras, adapters=("a", "b", "c"), max_loras=1) as fleet:
        (lora,), (state,) = fleet.loras, fleet.states
        state.behaviour = FakeBehaviour(wait_for=gate)
        async with openai.AsyncOpenAI(base_url=fleet.base_url, api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:
            held = [asyncio.create_task(sdk.chat.completions.create(model=m, messages=MESSAGES)) for m in "ab"]
            try:
                assert await asyncio.to_thread(wait_until, lambda: state.num_requests == 2, TIMEOUT_S)
                assert lora.unloaded == []  # b was loaded past max_loras: a was busy
                assert set(lora.loaded) == {"a", "b"}
            finally:
                gate.set()
            assert [answer.model for answer in await asyncio.gather(*held)] == ["a", "b"]
            await sdk.chat.completions.create(model="c", messages=MESSAGES)
        # the next load catches up (in which order depends on which of the two answers ended last:
        # the least-recently-used order is the subject of the LRU test above)
        assert sorted(lora.unloaded) == ["a", "b"]
        assert set(lora.loaded) == {"c"}


async def test_concurrent_first_requests_for_an_adapter_load_it_once():
    loras = _loras(2, "support")
    gate = threading.Event()
    for lora in loras:
        lora.load_gate = gate
    with _fleet(loras) as fleet:
        async with openai.AsyncOpenAI(base_url=fleet.base_url, api_key="k", max_retries=0, timeout=TIMEOUT_S) as sdk:

            async def one() -> str:
                raw = await sdk.chat.completions.with_raw_response.create(model="support", messages=MESSAGES)
                return raw.headers["x-switchyard-backend"]

            answers = asyncio.gather(*(one() for _ in range(6)))
            try:
                # every request has picked its replica, and the load the first one started has arrived
                def all_waiting() -> bool:
                    has_load = any(lora.load_arrived.is_set() for lora in loras)
                    return has_load and fleet.num_in_flight("support") == 6

                assert await asyncio.to_thread(wait_until, all_waiting, TIMEOUT_S)
            finally:
                gate.set()
            labels = await answers
    assert len(set(labels)) == 1
    assert sum(len(lora.load_requests) for lora in loras) == 1
    assert sum(lora.num_loads for lora in loras) == 1


def test_a_failed_load_is_a_clear_error_and_a_later_request_can_succeed():
    with _fleet(_loras(2)) as fleet, _sdk(fleet) as sdk:
        with pytest.raises(openai.NotFoundError) as caught:
            sdk.chat.completions.create(model="support", messages=MESSAGES)
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "adapter_load_failed"
        assert "LoRA adapter 'support' could not be loaded" in error["message"]
        assert "No adapter found" in error["message"]
        assert sum(len(lora.load_requests) for lora in fleet.loras) == 1  # a refusal: not retried
        assert fleet.backend.lora.loaded_on("support") == []
        assert fleet.app.state.services.executor.states()["base"] == "closed"

        for lora in fleet.loras:
            lora.paths.add("/adapters/support")
        label = _ask(sdk, "support")
        assert fleet.backend.lora.loaded_on("support") == [label]
        assert sum(lora.num_loads for lora in fleet.loras) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_a_replica_that_lost_its_adapter_gets_it_loaded_again(stream):
    with _fleet(_loras(2, "support")) as fleet, _sdk(fleet) as sdk:
        assert wait_until(fleet.has_listed_twice, TIMEOUT_S)
        label = _ask(sdk, "support")
        lora = fleet.loras[int(label.removeprefix("vllm#"))]
        lora.loaded.clear()  # the replica restarted; we have not read its /v1/models since

        assert _ask(sdk, "support", stream=stream) == label
        assert lora.num_unknown_model == 1  # vLLM's 404 "model does not exist", then a load and a retry
        assert lora.load_requests == ["support", "support"]
        assert set(lora.loaded) == {"support"}


async def test_a_probe_that_no_longer_lists_an_adapter_forgets_it():
    lora = FakeLoRA(paths={"/adapters/support"})
    state = FakeState(model_id="base")
    request = ChatCompletionRequest.from_payload({"model": "support", "messages": MESSAGES})
    with serve_in_thread(FakeVLLMUpstream(state, lora=lora)) as url:
        async with aiohttp.ClientSession() as session:
            base = VLLMBackend("base", [VLLMReplica(url + "/v1")], session, metrics_interval_s=HOUR_S)
            adapter = base.adapter("support", "/adapters/support")
            await base.start()
            try:
                await adapter.complete(request)
                assert base.lora.loaded_on("support") == ["vllm#0"]
                lora.loaded.clear()  # the server restarted
                assert (await base.health()).is_ready
                assert base.lora.loaded_on("support") == []
                await adapter.complete(request)
            finally:
                await base.aclose()
    assert lora.num_unknown_model == 0  # known before asking: loaded first, no 404 to recover from
    assert lora.load_requests == ["support", "support"]
