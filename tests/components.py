"""The real components some tests need: Valkey and PostgreSQL (from wheels), Chromium, Prometheus,
promtool, docker-compose and kubectl (Debian's packages, which .ci/run installs).

Where one cannot run, its tests skip with the reason; under CI=true they fail with it, because a
green CI run must have tested them. The run's last lines count the skips and give their reasons.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Skip the test for `reason`; under CI=true, fail it."""
    if in_ci():
        pytest.fail(f"{reason} [CI=true: a real component that cannot run fails the run]", pytrace=False)
    pytest.skip(reason)
