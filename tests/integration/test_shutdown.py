"""Stopping the proxy while requests are in flight loses no ledger record and writes none twice."""

from __future__ import annotations

import threading

import httpx

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread, stop_server
from tests.helpers import read_ledger, wait_until

NUM_QUICK = 8  # held upstream until the shutdown has begun, then answered within its grace: completed
NUM_SLOW = 6  # streams that never end by themselves, running when the shutdown begins: cancelled
TIMEOUT_S = 30  # bounds a hang only; also the grace, which the quick answers need a fraction of


def test_stopping_with_requests_in_flight_meters_each_exactly_once(tmp_path):
    released = threading.Event()
    state = FakeState(behaviour=FakeBehaviour(wait_for=released))
    outcomes: dict[str, str] = {}
    bodies: dict[str, str] = {}
    streaming = {f"shutdown-{n}": threading.Event() for n in range(NUM_QUICK, NUM_QUICK + NUM_SLOW)}
    lock = threading.Lock()

    def ask(base: str, n: int, slow: bool) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": f"request {n}"}], "stream": slow}
        if slow:  # a stream that never ends by itself (100 000 tokens, 0.1 s apart), not held upstream
            body["fake"] = {"num_tokens": 100_000, "token_delay_s": 0.1, "wait_for": None}
        request_id = f"shutdown-{n}"
        try:
            with httpx.stream(
                "POST",
                base + "/v1/chat/completions",
                json=body,
                headers={"x-request-id": request_id},
                timeout=TIMEOUT_S,
            ) as response:
                lines = []
                for line in response.iter_lines():
                    lines.append(line)
                    if slow and line.startswith("data: "):
                        streaming[request_id].set()  # its first tokens have reached the client
            outcome = f"http {response.status_code}"
            if slow:
                bodies[request_id] = "\n".join(lines)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        with lock:
            outcomes[request_id] = outcome

    with serve_in_thread(FakeOpenAIUpstream(state)) as upstream:
        app = create_app(Settings(models=[{"name": "m", "base_url": upstream + "/v1"}]))
        with serve_in_thread(app, graceful_shutdown_s=TIMEOUT_S) as base:
            threads = {
                n: threading.Thread(target=ask, args=(base, n, n >= NUM_QUICK)) for n in range(NUM_QUICK + NUM_SLOW)
            }
            for thread in threads.values():
                thread.start()
            try:
                # every request has reached the upstream, every stream has started: all are in flight
                assert wait_until(lambda: state.num_requests == NUM_QUICK + NUM_SLOW, timeout_s=TIMEOUT_S)
                assert all(started.wait(TIMEOUT_S) for started in streaming.values())
                stop_server(base)
                # the shutdown has begun once it has ended the streams (first thing it does); the quick
                # requests, still held upstream, are answered within its grace
                for n in range(NUM_QUICK, NUM_QUICK + NUM_SLOW):
                    threads[n].join(timeout=TIMEOUT_S)
            finally:
                released.set()
        # the proxy has stopped: its lifespan drained the requests and flushed the ledger
        for thread in threads.values():
            thread.join(timeout=TIMEOUT_S)

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
