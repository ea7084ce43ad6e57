"""A request's objects are freed when it ends, not left in reference cycles for the garbage
collector: a cycle per request made the proxy's collections run far more often under load."""

from __future__ import annotations

import gc
from contextlib import ExitStack

import httpx

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import wait_until

HI = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30  # bounds a hang only
# the request path's own objects: none may be left to the collector
OURS = {"Relayed", "RequestMeter", "RequestLine", "Spending", "RequestContext", "Decision", "Answered"}


def _num_ended(app) -> float:
    """The requests counted in `switchyard_requests_total`: counted when they end."""
    labels = {"model": "m", "backend": "openai#0", "tier": "", "route": "explicit", "status": "200"}
    return app.state.services.metrics.registry.get_sample_value("switchyard_requests_total", labels) or 0.0


def test_whole_and_streamed_requests_leave_no_cycles():
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(FakeState()))) + "/v1"
        app = create_app(Settings(models=[{"name": "m", "base_url": url}], billing={"ledger_path": None}))
        base = stack.enter_context(serve_in_thread(app))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=TIMEOUT_S))

        def ask(stream: bool) -> None:
            response = client.post("/v1/chat/completions", json={"model": "m", "messages": HI, "stream": stream})
            assert response.status_code == 200

        ask(False)
        ask(True)  # warmed up: what is made once (caches, pools) is made
        assert wait_until(lambda: _num_ended(app) == 2, TIMEOUT_S)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection would free is kept in gc.garbage instead
        try:
            for _ in range(5):
                ask(False)
                ask(True)
            assert wait_until(lambda: _num_ended(app) == 12, TIMEOUT_S)  # each ended: counted, logged
            gc.collect()
            left = sorted(type(o).__name__ for o in gc.garbage if type(o).__name__ in OURS)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert left == []
