"""What the backends and the cascade tell the meter of one request: each attempt's lifecycle.

A protocol, so that they need not know who keeps the books: `switchyard.billing.metering.RequestMeter`
implements it, and is the one owner of the ledger's rows (and of the budgets' reservations, which
it holds for the request's caller).

An attempt begins (`begin_attempt`), may see its first token (`first_token`), and ends once: it
failed (`failed`), or it ended otherwise (`finished`: completed, cancelled; `escalated`: the
cascade judged its answer and did not send it, with `judged` its verdict's numbers). The cascade
meters each rung by a `fork` of the request's meter: same request, same numbering of attempts.
Chunk counts are the caller's to pass: without the upstream's usage, an attempt's tokens are
estimated from them (a chunk a token).
"""

from __future__ import annotations

from typing import Any, Protocol, Self

from switchyard.core.errors import BudgetExceeded, SwitchyardError
from switchyard.core.requests import AnyRequest


class MeteredModel(Protocol):
    """What the meter needs of the model an attempt went to (`switchyard.backends.registry.ModelEntry`)."""

    @property
    def name(self) -> str: ...

    @property
    def backend_kind(self) -> str: ...

    @property
    def tier(self) -> str | None: ...

    @property
    def hosting(self) -> str | None:
        """The model's `hosting:` as the ledger records it; None: by backend_kind."""


class AttemptMeter(Protocol):
    """The metering of one client request, as those who make its attempts report them."""

    def begin_attempt(self) -> None:
        """An attempt is about to be made (its time starts now)."""

    def first_token(self) -> None:
        """The attempt's first token arrived (a stream's first chunk; an assembled answer's first event)."""

    def failed(
        self, entry: MeteredModel, error: SwitchyardError, *, deployment: str | None = None, num_chunks: int = 0
    ) -> None:
        """An attempt that failed (`deployment`: where it went, if it was called; `num_chunks`: of
        an answer assembled before it failed)."""

    def finished(
        self,
        entry: MeteredModel,
        status: str,
        usage: dict[str, Any] | None,
        num_chunks: int = 0,
        error: str | None = None,
        *,
        deployment: str | None = None,
    ) -> None:
        """The attempt that ended otherwise (completed, cancelled): metered once, however it ended
        (a call for an attempt metered already is ignored)."""

    def escalated(
        self,
        entry: MeteredModel,
        usage: dict[str, Any] | None,
        num_tokens: int,
        reason: str,
        *,
        deployment: str | None = None,
    ) -> None:
        """An answer the cascade judged and did not send (a stream cut short, or a whole answer)."""

    def judged(self, confidence: float | None, threshold: float) -> None:
        """The cascade's verdict on this attempt's answer: its record keeps both numbers."""

    def fork(self, *, escalated_from: str | None = None, is_hedge: bool = False) -> Self:
        """A meter for an attempt that runs beside this one (a cascade rung, a hedge)."""

    async def reserve_for(self, model: str, request: AnyRequest) -> bool:
        """Hold the worst-case cost of calls to `model` in the caller's budgets, once per model and
        request however often it is asked (True: it fits, or is held already, or no budgets)."""

    async def refusal_for(self, model: str, request: AnyRequest) -> BudgetExceeded | None:
        """Why `model`'s worst case does not fit the caller's budgets, and when to retry (None: no budgets)."""
