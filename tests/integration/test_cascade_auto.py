"""model="auto" with a cascade: the classifier picks the starting rung; a close call is hedged."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import numpy as np
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread


@pytest.fixture
def auto_cascade(tmp_path):
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",), logprobs=[-3.0])),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    with ExitStack() as stack:
        urls = {tier: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for tier, s in states.items()}
        settings = Settings(
            models=[{"name": f"m-{tier}", "base_url": url, "tier": tier} for tier, url in urls.items()],
            routing={
                "auto": {
                    "tiers": ["small", "large"],
                    "thresholds": [0.45],
                    "warm_up": False,
                    "deadline_ms": 10_000,
                    "max_wait_ms": 1,
                }
            },
            cascade={
                "ladder": ["m-small", "m-large"],
                "scorer": "mean_logprob",
                "threshold": -1.0,
                "hedge_margin": 0.05,
            },
            billing={"ledger_path": None},
        )
        # the score is read out of the prompt, so the route is known in advance
        app = create_app(settings, score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]))
        url = stack.enter_context(serve_in_thread(app))
        yield url, states


def _ask(url: str, score: float, stream: bool = False) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"score={score}"}], "stream": stream}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30)  # bounds a hang only


@pytest.mark.parametrize("stream", [False, True])
def test_the_classifier_picks_the_first_rung_and_the_cascade_climbs(auto_cascade, stream):
    url, states = auto_cascade
    low = _ask(url, 0.2, stream)
    assert low.headers["x-switchyard-route"] == "auto:classifier=0.200<0.450->small"
    assert low.headers["x-switchyard-cascade"] == "m-small(-3.00<-1.00)->m-large"
    assert low.headers["x-switchyard-model"] == "m-large"
    assert "large" in low.text and "small " not in low.text
    high = _ask(url, 0.9, stream)
    assert high.headers["x-switchyard-cascade"] == "m-large"  # the last rung: never judged
    assert states["small"].num_requests == 1


def test_a_score_close_to_the_threshold_is_hedged(auto_cascade):
    url, states = auto_cascade
    states["small"].behaviour.logprobs = [-0.1]
    states["small"].behaviour.wait_for = states["large"].arrived  # small answers once the hedge is upstream
    states["large"].behaviour.failure = "hang"  # and large never does: it can only lose
    close = _ask(url, 0.43)
    assert close.headers["x-switchyard-cascade"] == "m-small(-0.10>=-1.00);hedged"
    assert close.json()["choices"][0]["message"]["content"].startswith("small")
    assert states["large"].num_requests == 1  # started in parallel, then cancelled
    far = _ask(url, 0.2)
    assert not far.headers["x-switchyard-cascade"].endswith(";hedged")
    assert states["large"].num_requests == 1
