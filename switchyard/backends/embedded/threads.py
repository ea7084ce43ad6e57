"""OpenMP settings for the whole process, chosen before torch is imported.

libgomp reads `OMP_WAIT_POLICY` once, when torch loads it; setting the variable later changes
nothing. `switchyard serve` imports torch while it builds the backends (the classifier, the
embedding model, the engines' modules), so the choice is made by the command, before any of that.

Why passive: a served process holds several OpenMP teams (one per engine thread, plus the threads
that loaded the models), more threads than a small machine has cores. libgomp then cuts its
spin-wait to ~100 iterations anyway and every parallel region ends in a futex sleep and wake
(profiled: over half of the engine thread's samples); with the default policy a team alone in the
process spins ~300,000 iterations instead, which collapses a decode to a few tokens/s as soon as
another process wants the cores. Passive makes explicit what the throttle already does in a
served process, and also covers a process that holds a single team (one engine, nothing else).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping

logger = logging.getLogger("switchyard.engine")

WAIT_POLICY = "PASSIVE"


def choose_wait_policy(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set `OMP_WAIT_POLICY` for this process (and its workers) unless the environment already
    does; returns the policy in force. Call it before anything imports torch."""
    if "OMP_WAIT_POLICY" in environ:
        return environ["OMP_WAIT_POLICY"]
    if "torch" in sys.modules:
        logger.warning("torch was imported before OMP_WAIT_POLICY was chosen: libgomp keeps its default policy")
    environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return WAIT_POLICY


def use_threads(num_threads: int | None) -> None:
    """Run this thread's torch work on `num_threads` intra-op threads (default: every core).

    torch copies its last `set_num_threads` (whichever model loaded last, in any thread) into each
    new thread's OpenMP settings; an engine thread sets its own, so its speed does not depend on
    which model happened to load first.
    """
    import torch

    torch.set_num_threads(num_threads or os.cpu_count() or 1)
