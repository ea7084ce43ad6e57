"""Repeated log lines, rate-limited: a flood of bad requests must not become a flood of logs.

`RepeatFilter` lets a warning or error (its logger, level and format string) through at most once
per `interval_s`; the next one let through says how many were suppressed meanwhile. Debug and info
lines, and the access log, pass untouched.
"""

from __future__ import annotations

import logging
import threading
import time

LOGGER_PREFIXES = ("switchyard", "uvicorn")
UNLIMITED = frozenset({"uvicorn.access"})
DEFAULT_INTERVAL_S = 10.0


class RepeatFilter(logging.Filter):
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int, str], tuple[float, int]] = {}  # key: (emitted at, suppressed since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            emitted_at, num_suppressed = self._last.get(key, (None, 0))
            if emitted_at is not None and now - emitted_at < self.interval_s:
                self._last[key] = (emitted_at, num_suppressed + 1)
                return False
            self._last[key] = (now, 0)
            if len(self._last) > 10_000:  # many distinct messages: forget the old windows
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval_s}
        if num_suppressed:
            record.msg = f"{record.msg} ({num_suppressed} like it suppressed in the last {self.interval_s:g} s)"
        return True


def install_repeat_filter(interval_s: float = DEFAULT_INTERVAL_S) -> RepeatFilter:
    """Put one shared filter on the switchyard and uvicorn loggers (a logger's filter sees only its
    own records, so each existing logger of those families gets it); calling it again is harmless."""
    shared = RepeatFilter(interval_s)
    names = [name for name in logging.Logger.manager.loggerDict if _is_ours(name)]
    for name in {*LOGGER_PREFIXES, "uvicorn.error", *names}:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, RepeatFilter) for existing in logger.filters):
            logger.addFilter(shared)
    return shared


def remove_repeat_filter() -> None:
    for name in [*logging.Logger.manager.loggerDict, *LOGGER_PREFIXES]:
        logger = logging.getLogger(name)
        for existing in [f for f in logger.filters if isinstance(f, RepeatFilter)]:
            logger.removeFilter(existing)


def _is_ours(name: str) -> bool:
    return name not in UNLIMITED and any(name == prefix or name.startswith(prefix + ".") for prefix in LOGGER_PREFIXES)
