"""Stopping the proxy while requests are in flight loses no ledger record and writes none twice."""

from __future__ import annotations

import threading

import httpx

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

NUM_QUICK = 8  # answered within the server's 1 s graceful shutdown: completed
NUM_SLOW = 6  # streams still running when the server gives up on them: cancelled


def test_stopping_with_requests_in_flight_meters_each_exactly_once(tmp_path):
    state = FakeState(behaviour=FakeBehaviour(latency_s=0.3))
    outcomes: dict[str, str] = {}
    bodies: dict[str, str] = {}
    lock = threading.Lock()

    def ask(base: str, n: int, slow: bool) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": f"request {n}"}], "stream": slow}
        if slow:  # a long stream: 100 tokens, 0.1 s apart
            body["fake"] = {"num_tokens": 100, "token_delay_s": 0.1, "latency_s": 0}
        request_id = f"shutdown-{n}"
        try:
            response = httpx.post(
                base + "/v1/chat/completions", json=body, headers={"x-request-id": request_id}, timeout=30
            )
            outcome = f"http {response.status_code}"
            if slow:
                bodies[request_id] = response.text
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        with lock:
            outcomes[request_id] = outcome

    with serve_in_thread(FakeOpenAIUpstream(state)) as upstream:
        app = create_app(Settings(models=[{"name": "m", "base_url": upstream + "/v1"}]))
        with serve_in_thread(app) as base:
            threads = [
                threading.Thread(target=ask, args=(base, n, n >= NUM_QUICK)) for n in range(NUM_QUICK + NUM_SLOW)
            ]
            for thread in threads:
                thread.start()
            # every request has reached the upstream: all of them are in flight at the proxy
            assert wait_until(lambda: state.num_requests == NUM_QUICK + NUM_SLOW, timeout_s=20)
        # the proxy has stopped: its lifespan drained the requests and flushed the ledger
        for thread in threads:
            thread.join(timeout=30)

    records = [r for r in read_ledger(app) if (r.client_request_id or "").startswith("shutdown-")]
    ids = [r.client_request_id for r in records]
    assert sorted(ids) == sorted(outcomes), (records, outcomes)  # one record per request, none missing
    assert len(set(ids)) == len(ids)  # none twice
    statuses = {r.client_request_id: r.status for r in records}
    for n in range(NUM_QUICK):
        assert statuses[f"shutdown-{n}"] == "completed" and outcomes[f"shutdown-{n}"] == "http 200"
    for n in range(NUM_QUICK, NUM_QUICK + NUM_SLOW):
        assert statuses[f"shutdown-{n}"] == "cancelled"
        # ended properly, not cut: some tokens, then an in-band error, then [DONE]
        events = [line for line in bodies[f"shutdown-{n}"].split("\n") if line.startswith("data: ")]
        assert events[0].startswith('data: {"id"') or '"choices"' in events[0], events[:2]
        assert '"code":"server_shutting_down"' in events[-2] and events[-1] == "data: [DONE]", events[-3:]
