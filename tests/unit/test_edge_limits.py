"""The edge's arithmetic and the log rate limit, without a server."""

from __future__ import annotations

import logging

from switchyard.proxy import log_limits
from switchyard.proxy.edge import accept_backlog, effective_max_connections
from switchyard.proxy.log_limits import RepeatFilter


def test_the_connection_cap_leaves_file_descriptors_for_the_rest():
    assert effective_max_connections(4096, nofile=1024) == 768
    assert effective_max_connections(4096, nofile=256) == 128  # the reserve is at least 128
    assert effective_max_connections(4096, nofile=1_048_576) == 4096
    assert effective_max_connections(100, nofile=1024) == 100
    assert effective_max_connections(4096, nofile=100) == 1


def test_the_accept_backlog_fits_in_the_file_descriptor_reserve():
    # a batch of newcomers accepted at once, at the cap, with the refusals lingering, must still fit
    for nofile in (256, 1024, 4096, 65_536):
        cap = effective_max_connections(10**9, nofile=nofile)
        assert cap + 32 + accept_backlog(nofile) <= nofile - 64
    assert accept_backlog(256) == 32
    assert accept_backlog(1_048_576) == 2048  # uvicorn's default where the limit allows it


class _Clock:
    """Stands in for the `time` module in log_limits: the test moves time, not the machine's speed."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s


def test_a_message_suppressed_in_its_window_is_counted_in_the_next_one(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(log_limits, "time", clock)
    limit = RepeatFilter(interval_s=10)
    record = logging.LogRecord("switchyard", logging.WARNING, __file__, 1, "upstream %s failed", ("a",), None)

    def passes() -> bool:
        copy = logging.makeLogRecord(record.__dict__)
        return limit.filter(copy) and bool(lines.append(copy.getMessage()) or True)

    lines: list[str] = []
    assert passes()
    for _ in range(49):
        clock.now_s += 0.2
        assert not passes()
    clock.now_s = 1010.0  # the window of the first one has just ended
    assert passes()
    clock.now_s += 9.9
    assert not passes()
    assert lines == ["upstream a failed", "upstream a failed (49 like it suppressed in the last 10 s)"]


def test_info_lines_are_never_limited():
    limit = RepeatFilter(interval_s=60)
    record = logging.LogRecord("switchyard", logging.INFO, __file__, 1, "started", (), None)
    assert all(limit.filter(record) for _ in range(10))
