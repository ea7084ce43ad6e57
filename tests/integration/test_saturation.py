"""A saturated vLLM replica: best-effort requests degrade, priority requests wait, others go ahead."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import httpx
import openai
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.fakes.vllm_upstream import FakeVLLMUpstream, VLLMLoad
from tests.helpers import wait_until

HI = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30  # bounds a hang only


@contextmanager
def _saturated(cascade: dict):
    big, small, load = (
        FakeState(behaviour=FakeBehaviour(words=("big",))),
        FakeState(behaviour=FakeBehaviour(words=("small",))),
        VLLMLoad(waiting=10),
    )
    with ExitStack() as stack:
        big_url = stack.enter_context(serve_in_thread(FakeVLLMUpstream(big, load))) + "/v1"
        small_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(small))) + "/v1"
        settings = Settings(
            models=[
                {
                    "name": "big",
                    "backend": "vllm",
                    "base_url": big_url,
                    "degrade_to": "small",
                    "vllm": {"metrics_interval_s": 0.05, "max_waiting": 4},
                },
                {"name": "small", "base_url": small_url},
                {"name": "top", "base_url": small_url},
            ],
            cascade=cascade,
            resilience={"saturation_wait_s": TIMEOUT_S},  # a priority request waits for the test to clear it
            upstream={"health_timeout_s": TIMEOUT_S},  # a probe a busy machine answers slowly is no outage
        )
        app = create_app(settings)
        base = stack.enter_context(serve_in_thread(app))
        sdk = stack.enter_context(openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=TIMEOUT_S))
        # the backend starts (and scrapes its replica's load) in the background
        assert wait_until(app.state.services.registry.get("big").backend.is_saturated, timeout_s=TIMEOUT_S)
        yield sdk, big, small, load, app


@pytest.fixture
def saturated():
    with _saturated({}) as parts:
        yield parts


def _ask(sdk, priority: str | None):
    headers = {"x-switchyard-priority": priority} if priority else None
    return sdk.chat.completions.with_raw_response.create(model="big", messages=HI, extra_headers=headers)


def test_best_effort_degrades_to_the_smaller_model(saturated):
    sdk, big, small, _, _ = saturated
    raw = _ask(sdk, "best-effort")
    assert raw.headers["x-switchyard-degraded"] == "1"
    assert raw.headers["x-switchyard-model"] == "small"
    assert raw.parse().choices[0].message.content.startswith("small")
    assert big.num_requests == 0
    metrics = httpx.get(str(sdk.base_url).removesuffix("/v1/") + "/metrics", timeout=TIMEOUT_S).text
    assert "switchyard_degraded_total 1" in metrics
    assert 'switchyard_model_saturated{model="big"} 1' in metrics


def test_a_cascade_request_degraded_off_the_ladder_is_answered_by_the_smaller_model():
    # `small` is no rung of the ladder: the degraded request is answered without the cascade
    with _saturated({"ladder": ["big", "top"]}) as (sdk, big, small, _, _):
        raw = sdk.chat.completions.with_raw_response.create(
            model="cascade", messages=HI, extra_headers={"x-switchyard-priority": "best-effort"}
        )
        assert raw.status_code == 200
        assert raw.headers["x-switchyard-degraded"] == "1"
        assert raw.headers["x-switchyard-model"] == "small"
        assert raw.parse().choices[0].message.content.startswith("small")
        assert big.num_requests == 0


def test_standard_goes_ahead(saturated):
    sdk, big, _, _, _ = saturated
    raw = _ask(sdk, None)
    assert raw.headers["x-switchyard-model"] == "big"
    assert "x-switchyard-degraded" not in raw.headers
    assert big.num_requests == 1


def test_priority_waits_until_the_saturation_clears(saturated):
    sdk, big, _, load, app = saturated
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(_ask, sdk, "priority")
        try:
            assert wait_until(lambda: app.state.services.saturation.num_waiting == 1, timeout_s=TIMEOUT_S)
            assert big.num_requests == 0  # it waits
        finally:
            load.waiting = 0  # the saturation clears: seen at the next scrape
        raw = asked.result(timeout=TIMEOUT_S)
    assert raw.headers["x-switchyard-model"] == "big"
    assert "x-switchyard-degraded" not in raw.headers
    assert big.num_requests == 1
    assert app.state.services.saturation.num_waiting == 0


def test_priority_gives_up_after_its_deadline(saturated):
    sdk, big, _, _, app = saturated
    app.state.services.saturation.wait_s = 0.2
    with pytest.raises(openai.InternalServerError) as info:
        _ask(sdk, "priority")
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"] == "2"
    assert "stayed saturated" in info.value.response.json()["error"]["message"]
    assert big.num_requests == 0


def test_an_unknown_priority_is_a_400(saturated):
    sdk, *_ = saturated
    with pytest.raises(openai.BadRequestError, match="best-effort, standard, priority"):
        _ask(sdk, "urgent")
