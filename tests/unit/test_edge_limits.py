"""The edge's arithmetic and the log rate limit, without a server."""

from __future__ import annotations

import logging

from switchyard.proxy import log_limits
from switchyard.proxy.edge import effective_max_connections
from switchyard.proxy.log_limits import RepeatFilter


def test_the_connection_cap_leaves_file_descriptors_for_the_rest():
    assert effective_max_connections(4096, nofile=1024) == 768
    assert effective_max_connections(4096, nofile=256) == 128  # the reserve is at least 128
    assert effective_max_connections(4096, nofile=1_048_576) == 4096
    assert effective_max_connections(100, nofile=1024) == 100
    assert effective_max_connections(4096, nofile=100) == 1


class _Clock:
    """The filter's clock, moved by hand: no test depends on how fast the machine is."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_a_message_suppressed_in_its_window_is_counted_in_the_next_one(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(log_limits, "time", clock)
    limit = RepeatFilter(interval_s=0.2)
    record = logging.LogRecord("switchyard", logging.WARNING, __file__, 1, "upstream %s failed", ("a",), None)

    def passes() -> bool:
        copy = logging.makeLogRecord(record.__dict__)
        return limit.filter(copy) and bool(lines.append(copy.getMessage()) or True)

    lines: list[str] = []
    assert [passes() for _ in range(50)] == [True] + [False] * 49
    clock.now += 0.19
    assert not passes()
    clock.now += 0.06
    assert passes()
    assert lines == ["upstream a failed", "upstream a failed (50 like it suppressed in the last 0.2 s)"]


def test_info_lines_are_never_limited():
    limit = RepeatFilter(interval_s=60)
    record = logging.LogRecord("switchyard", logging.INFO, __file__, 1, "started", (), None)
    assert all(limit.filter(record) for _ in range(10))
