"""The interface every backend implements, with its optional abilities declared (and defaulted) here."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.breaker import Breaker, Ticket
from switchyard.backends.token_counts import APPROXIMATION, TokenCount, approximate_count, run_counter
from switchyard.core.capabilities import EVERYTHING, Capabilities
from switchyard.core.chat_wire import CompletionResult, StreamChunk
from switchyard.core.errors import InvalidRequest
from switchyard.core.prices import Price
from switchyard.core.requests import AnyRequest, GenerationRequest
from switchyard.core.supervision import SupervisedTask

__all__ = ["AnyRequest", "Backend", "BackendHealth", "Pick", "StreamProgress"]


@dataclass(frozen=True, slots=True)
class BackendHealth:
    is_ready: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Pick:
    """Where one attempt goes, chosen before the call: the deployment's label (`openai#1`,
    `litellm#0`; never its address), and the ticket of that replica's breaker when the executor
    keeps one per replica (the executor settles it with the attempt's outcome)."""

    label: str | None = None
    ticket: Ticket | None = None


class StreamProgress(Protocol):
    """What a backend tells its caller while it reads a whole answer from its upstream's stream."""

    def first_event(self) -> None:
        """The stream's first event arrived: the wait for a first token is over."""

    def num_events(self, num_events: int) -> None:
        """So many events so far (an answer cut short is metered from them)."""


class Backend(ABC):
    """A deployment that answers OpenAI-shaped requests.

    `complete()` answers a chat request with a `ChatCompletion` and a legacy completion request with
    a `Completion`, both carried as a `CompletionResult` (the upstream's bytes, parsed on demand,
    `as_chat_completion()` for the typed model). `stream()` yields the upstream's chunks. Both raise
    `switchyard.core.errors.BackendError` subclasses; `stream()` raises before its first chunk when
    it can. The methods below the abstract ones are optional abilities with their defaults.

    A call goes to the deployment `pick()` chose (the executor picks first, so that it knows where
    the attempt went); called without a pick, a backend picks for itself.
    """

    name: str
    label: str | None = None  # the deployment's label, when the backend has one deployment
    starts_in_background = False  # `start()` does real work (loads a model, starts polling)

    @abstractmethod
    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult: ...

    @abstractmethod
    def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]: ...

    @abstractmethod
    async def health(self) -> BackendHealth: ...

    @abstractmethod
    def is_ready(self) -> bool:
        """The last health verdict, without probing."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def complete_from_stream(
        self, request: AnyRequest, pick: Pick | None, progress: StreamProgress
    ) -> CompletionResult:
        """A whole answer asked of the upstream as a stream and assembled (backends/assemble.py), so
        that its caller can bound the wait for its first event. The default reads `stream()` chunk by
        chunk; a backend that reads its upstream's bytes itself can do it in bulk."""
        chunks = self.stream(request, pick)
        assembler = AnswerAssembler(self.name)
        try:
            async for chunk in chunks:
                if assembler.first is None:
                    progress.first_event()
                assembler.add(chunk)
                progress.num_events(assembler.num_chunks)
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        return assembler.result()

    async def start(self) -> None:  # noqa: B027 - an optional ability, a no-op by default
        """Load or connect in the background after the server starts (the embedded engine's model)."""

    def load_failure(self) -> str | None:
        """Why the model failed to load, in words fit for /health/ready (which answers without a
        key); None while it loads or serves, and for a backend that loads nothing."""
        return None

    def is_saturated(self) -> bool:
        """Busy enough that best-effort requests should go elsewhere."""
        return False

    def pick(self, request: AnyRequest, *, use_breakers: bool = False) -> Pick:
        """The deployment `request` goes to. A backend with several replicas balances them; with
        `use_breakers`, only among those whose breaker (`attach_breakers`) admits a call now, and
        raises CircuitOpen or CoolingDown when none does."""
        return Pick(self.label)

    def attach_breakers(self, make_breaker: Callable[[], Breaker]) -> Sequence[tuple[str, Breaker]]:
        """Give each of several replicas its own breaker (`make_breaker()`); returns them by replica
        label. A backend without replicas to choose among keeps none: the model's breaker is its own."""
        return ()

    def background_tasks(self) -> Sequence[SupervisedTask]:
        """The long-running tasks `start()` began (readiness shows their state)."""
        return ()

    def capabilities(self) -> Capabilities:
        """What this backend's model can do, before the config's `capabilities:` override it.
        The default claims everything: an OpenAI-compatible upstream is trusted to refuse itself."""
        return EVERYTHING

    def price(self) -> Price | None:
        """The backend's own price, used when the config gives none (LiteLLM's price map)."""
        return None

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """The prompt tokens `request` would cost this model: a chat request's messages with its chat
        template applied, a completion's prompt. The default counts with OpenAI's cl100k_base over
        OpenAI's chat format, marked approximate (`backends/token_counts.py`)."""
        return await run_counter(lambda: approximate_count(request), request, encoding=APPROXIMATION)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of this model's token ids. The default refuses: a model counted by approximation
        has no token ids of its own to read."""
        raise InvalidRequest(
            f"The model '{self.name}' has no tokenizer Switchyard can reach, so it cannot detokenize; "
            "/v1/tokenize counts its prompts approximately.",
            param="model",
            code="unsupported_model",
        )

    def adapter(self, name: str, source: str) -> Backend:
        """A backend that answers as this model with the LoRA adapter `name` (read from `source`)
        applied: the registry lists it under the adapter's name. Only self-hosted backends have it."""
        raise NotImplementedError(f"backend {type(self).__name__} serves no LoRA adapters")
