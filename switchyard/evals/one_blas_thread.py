"""Fitting on one BLAS thread.

The classifier's heads fit small matrices (a few thousand rows of 400 columns) many times over.
OpenBLAS splits each product across its threads and spins while they wait: on a 2-core machine
`switchyard classifier train` on 1,000 prompts took 29.5 s and 60 s of CPU with two threads,
10.4 s and 14 s with one. One thread also makes a trained artifact the same on every machine,
whatever its core count (the sums no longer split by thread)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def one_blas_thread(fit: Callable[P, R]) -> Callable[P, R]:
    """`fit`, run with BLAS limited to one thread (restored afterwards)."""

    @wraps(fit)
    def limited(*args: P.args, **kwargs: P.kwargs) -> R:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return fit(*args, **kwargs)

    return limited
