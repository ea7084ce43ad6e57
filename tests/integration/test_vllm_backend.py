"""The vLLM backend against fake vLLM servers that publish their load on /metrics."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import aiohttp
import pytest

from switchyard.backends.vllm import SaturationLimits, VLLMBackend, VLLMReplica, parse_prometheus
from switchyard.core.chat_wire import ChatCompletionRequest
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.fakes.vllm_upstream import METRICS_TEMPLATE, FakeVLLMUpstream, VLLMLoad
from tests.helpers import wait_until

TIMEOUT_S = 30  # bounds a hang only: a scrape or probe a busy machine answers slowly is no outage


def test_parse_prometheus_sums_label_sets_and_skips_comments():
    text = METRICS_TEMPLATE.format(model="m", running=3, waiting=2, kv=0.5)
    text += 'vllm:num_requests_waiting{engine="1",model_name="m"} 4\nnot a metric line\nvllm:weird NaN\n'
    metrics = parse_prometheus(text)
    assert metrics["vllm:num_requests_running"] == 3
    assert metrics["vllm:num_requests_waiting"] == 6
    assert metrics["vllm:kv_cache_usage_perc"] == 0.5
    assert "vllm:weird" not in metrics


@pytest.fixture
def fleet():
    """Three fake vLLM replicas: (urls, states, loads)."""
    states = [FakeState() for _ in range(3)]
    loads = [VLLMLoad() for _ in range(3)]
    with ExitStack() as stack:
        urls = [
            stack.enter_context(serve_in_thread(FakeVLLMUpstream(s, load))) + "/v1"
            for s, load in zip(states, loads, strict=True)
        ]
        yield urls, states, loads


def _request(system: str | None = None) -> ChatCompletionRequest:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "hi"}]
    return ChatCompletionRequest.from_payload({"model": "big", "messages": messages})


async def _with_backend(urls, body, **kwargs):
    async with aiohttp.ClientSession() as session:
        backend = VLLMBackend(
            "big", [VLLMReplica(u) for u in urls], session, metrics_interval_s=60, health_timeout_s=TIMEOUT_S, **kwargs
        )
        await backend.start()
        try:
            return await body(backend)
        finally:
            await backend.aclose()


async def test_requests_go_to_the_least_loaded_replica(fleet):
    urls, states, loads = fleet
    loads[0].running, loads[0].waiting = 8, 3
    loads[1].running = 1
    loads[2].running, loads[2].waiting = 6, 0

    async def body(backend):
        for _ in range(4):
            await backend.complete(_request())
        return [r.num_waiting + r.num_running for r in backend.replicas]

    scraped = await _with_backend(urls, body)
    assert scraped == [11, 1, 6]
    # Replica 1 (load 1) takes requests until what we sent brings it level with replica 2 (load 6).
    assert [s.num_requests for s in states] == [0, 4, 0]
    assert all(load.num_scrapes >= 1 for load in loads)


async def test_saturation_signal_and_spill_over(fleet):
    urls, states, loads = fleet
    for load in loads:
        load.waiting = 10
    loads[2].kv_cache_usage = 0.5

    async def body(backend):
        saturated = backend.is_saturated()
        loads[2].waiting = 0
        await backend.scrape()
        return saturated, backend.is_saturated(), [r.is_saturated for r in backend.replicas]

    saturated_before, saturated_after, per_replica = await _with_backend(urls, body, limits=SaturationLimits(4, 0.9))
    assert saturated_before is True
    assert saturated_after is False
    assert per_replica == [True, True, False]


async def test_one_system_prompt_sticks_to_one_replica(fleet):
    urls, states, _ = fleet
    systems = [f"You are assistant number {i}." for i in range(12)]

    async def body(backend):
        placements: dict[str, set[int]] = {}
        for _ in range(3):
            for system in systems:
                before = [s.num_requests for s in states]
                await backend.complete(_request(system))
                [home] = [i for i, s in enumerate(states) if s.num_requests != before[i]]
                placements.setdefault(system, set()).add(home)
        return placements

    placements = await _with_backend(urls, body)
    assert all(len(homes) == 1 for homes in placements.values())
    assert len({next(iter(homes)) for homes in placements.values()}) > 1  # different prompts spread out


async def test_a_saturated_sticky_replica_is_skipped(fleet):
    urls, states, loads = fleet
    system = "You are a very popular assistant."

    async def body(backend):
        await backend.complete(_request(system))
        home = next(i for i, s in enumerate(states) if s.num_requests)
        loads[home].waiting = 50
        await backend.scrape()
        await backend.complete(_request(system))
        return home

    home = await _with_backend(urls, body)
    assert states[home].num_requests == 1
    assert sum(s.num_requests for s in states) == 2


async def test_a_server_without_metrics_still_serves():
    state = FakeState()
    with serve_in_thread(FakeOpenAIUpstream(state)) as url:

        async def body(backend):
            results = await asyncio.gather(*(backend.complete(_request()) for _ in range(3)))
            return results, backend.replicas[0].has_metrics

        results, has_metrics = await _with_backend([url + "/v1"], body)
    assert len(results) == 3 and state.num_requests == 3
    assert has_metrics is False


def test_backend_vllm_in_the_proxy_config(fleet):
    import openai

    from switchyard.core.settings import Settings
    from switchyard.proxy.app import create_app

    urls, states, loads = fleet
    loads[0].waiting = 9
    settings = Settings(
        models=[
            {
                "name": "big",
                "backend": "vllm",
                "replicas": [{"base_url": u} for u in urls[:2]],
                "vllm": {"metrics_interval_s": 0.2, "max_waiting": 4},
            }
        ],
        upstream={"health_timeout_s": TIMEOUT_S},
    )
    app = create_app(settings)
    with serve_in_thread(app) as url, openai.OpenAI(base_url=url + "/v1", api_key="k", timeout=TIMEOUT_S) as sdk:
        # the backend starts (and scrapes its replicas' load) in the background
        saturated = app.state.services.registry.get("big").backend.replicas[0]
        assert wait_until(lambda: saturated.is_saturated, timeout_s=TIMEOUT_S)
        raw = sdk.chat.completions.with_raw_response.create(model="big", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-switchyard-backend"] == "vllm#1"  # replicas[1], the one not saturated
    assert states[1].num_requests == 1 and states[0].num_requests == 0
