"""Advisory locks on a file, shared by the processes of one machine (`flock`)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: str | Path, operation: int = fcntl.LOCK_EX) -> Iterator[None]:
    """Hold `path` (created if missing, never removed) locked, exclusively by default or shared
    with `fcntl.LOCK_SH`, until the block ends; waits for a conflicting holder."""
    with open(path, "a") as file:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)
