"""The drift gauges through the proxy: traffic like the reference, then a shifted mix.

`auto` routes between m-small and m-large with a thresholds file whose routing section carries a
reference (the classifier replaced by a scorer that reads the score out of the prompt); the
cascade climbs from m-cheap to m-large, and its rung has no reference in the file, so the first
window after load is its reference. The fake upstream answers with the logprobs each request asks
for, so every confidence is known in advance.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from switchyard.core.settings import Settings
from switchyard.evals.drift_reference import strong_share_reference
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

WINDOW = 40
LIKE_SCORES = [0.05 + 0.1 * k for k in range(10)]  # the reference: even over [0, 1], half at or above 0.5
LIKE_CONFIDENCE = [-0.05 - 0.15 * k for k in range(10)]  # three in ten under the threshold, -1.0


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("drift")
    thresholds = tmp / "thresholds.yaml"
    reference = strong_share_reference(np.array(LIKE_SCORES), 0.5)
    thresholds.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "routing": {"router": "classifier", "threshold": 0.5, "reference": reference},
                "cascade": {
                    "rungs": {"m-cheap": {"scorer": {"kind": "feature", "feature": "mean_logprob"}, "threshold": -1.0}}
                },
            }
        )
    )
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        settings = Settings(
            models=[
                {"name": "m-cheap", "base_url": url, "tier": "cheap"},
                {"name": "m-small", "base_url": url, "tier": "small"},
                {"name": "m-large", "base_url": url, "tier": "large"},
            ],
            routing={
                "thresholds_file": thresholds,
                "auto": {"tiers": ["small", "large"], "warm_up": False, "deadline_ms": 10_000, "max_wait_ms": 1},
            },
            cascade={"ladder": ["m-cheap", "m-large"], "thrash": {"min_requests": 10_000}},  # judge every one
            drift={"window": WINDOW, "min_samples": WINDOW // 2, "psi_alert": 0.2},
            billing={"ledger_path": None},
            upstream={"health_timeout_s": 30},
        )

        def score_batch(texts):
            return np.array([float(t.rsplit("=", 1)[-1]) for t in texts])

        yield stack.enter_context(serve_in_thread(create_app(settings, score_batch=score_batch)))


def _send(client: httpx.Client, model: str, content: str, logprob: float | None = None) -> None:
    body: dict = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 5}
    if logprob is not None:
        body["fake"] = {"logprobs": [logprob]}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text


def _drift(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families
        if f.name.startswith("switchyard_drift")
        for s in f.samples
    }


def _psi(values: dict, signal: str) -> float | None:
    return values.get(("switchyard_drift_psi", (("signal", signal),)))


def _rate(values: dict, signal: str, kind: str) -> float | None:
    return values.get(("switchyard_drift_rate", (("kind", kind), ("signal", signal))))


def test_the_classifier_score_psi_rises_when_the_mix_shifts(proxy):
    with httpx.Client(base_url=proxy, timeout=30) as client:  # the timeout bounds a hang only
        for i in range(WINDOW):
            _send(client, "auto", f"score={LIKE_SCORES[i % 10]:.2f}")
        like = _drift(proxy)
        for _ in range(WINDOW):  # only hard prompts now
            _send(client, "auto", "score=0.97")
        shifted = _drift(proxy)
    assert like[("switchyard_drift_psi_alert", ())] == 0.2
    assert like[("switchyard_drift_reference_samples", (("signal", "classifier_score"), ("source", "file")))] == 10
    assert _psi(like, "classifier_score") == pytest.approx(0.0, abs=1e-9)  # the reference's own mix
    assert _rate(like, "classifier_score", "observed") == 0.5 == _rate(like, "classifier_score", "predicted")
    assert _psi(shifted, "classifier_score") > 0.2 * 10
    assert _rate(shifted, "classifier_score", "observed") == 1.0
    assert _rate(shifted, "classifier_score", "predicted") == 0.5


def test_a_rung_without_a_reference_takes_the_first_window_then_sees_the_shift(proxy):
    with httpx.Client(base_url=proxy, timeout=30) as client:
        for i in range(WINDOW):
            _send(client, "cascade", "hi", LIKE_CONFIDENCE[i % 10])
        warmed = _drift(proxy)
        for i in range(WINDOW):
            _send(client, "cascade", "hi", LIKE_CONFIDENCE[i % 10])
        like = _drift(proxy)
        for _ in range(WINDOW):  # every answer unsure now
            _send(client, "cascade", "hi", -1.8)
        shifted = _drift(proxy)
    samples = ("switchyard_drift_reference_samples", (("signal", "cascade_confidence"), ("source", "warm-up")))
    assert warmed[samples] == WINDOW
    assert _psi(warmed, "cascade_confidence") is None  # the warm-up is the reference, not the window
    assert _psi(like, "cascade_confidence") == pytest.approx(0.0, abs=1e-9)
    assert _rate(like, "cascade_confidence", "observed") == pytest.approx(0.3)
    assert _rate(like, "cascade_confidence", "predicted") == pytest.approx(0.3)
    assert _psi(shifted, "cascade_confidence") > 0.2 * 10
    assert _rate(shifted, "cascade_confidence", "observed") == 1.0
