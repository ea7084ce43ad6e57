"""LoRA adapters on the embedded engine: each loaded adapter runs on an engine of its own.

The engine packs every request of a batch into one row, so requests of different adapters cannot
share a forward pass. An adapter is merged instead into a copy of its base model that shares every
tensor the adapter leaves alone (`models.load_adapter_model`), and that copy gets an engine of its
own. A base model's `AdapterPool` loads an adapter on its first request (once, however many ask at
once), holds at most `max_loras` loaded, and stops the least recently used idle one to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from switchyard.backends.base import Backend, BackendHealth
from switchyard.backends.embedded.backend import EmbeddedBackend
from switchyard.backends.embedded.constraints import JsonGrammar
from switchyard.backends.embedded.engine import EmbeddedEngine
from switchyard.backends.token_counts import TokenCount
from switchyard.core.capabilities import Capabilities
from switchyard.core.errors import BackendUnavailable
from switchyard.core.requests import GenerationRequest

logger = logging.getLogger("switchyard.engine")


@dataclass(slots=True)
class _Loaded:
    engine: EmbeddedEngine
    num_in_flight: int = 0


class AdapterPool:
    """The adapters of one base model that are loaded now, each on its own engine."""

    def __init__(self, base: EmbeddedBackend, max_loras: int) -> None:
        self.base = base
        self.max_loras = max_loras
        self.num_loads: Counter[str] = Counter()  # successful loads, by adapter
        self.load_errors: dict[str, str] = {}  # the last load's failure, until a load succeeds
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()  # least recently used first
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._num_waiting: Counter[str] = Counter()  # requests waiting for each load in progress
        self.num_waiting_for_room = 0  # requests whose adapter waits for a slot to come free
        self._num_stopping = 0
        self._changed = asyncio.Event()  # set (and replaced) when a slot may have come free
        self._is_closed = False

    @property
    def loaded(self) -> list[str]:
        """The adapters loaded now, least recently used first."""
        return list(self._loaded)

    def engine_of(self, name: str) -> EmbeddedEngine | None:
        loaded = self._loaded.get(name)
        return loaded.engine if loaded is not None else None

    @contextlib.asynccontextmanager
    async def use(self, name: str, source: str) -> AsyncIterator[EmbeddedEngine]:
        """The engine of adapter `name`, loaded first if it is not; it stays loaded while in use."""
        loaded = await self._acquire(name, source)
        try:
            yield loaded.engine
        finally:
            loaded.num_in_flight -= 1
            self._signal()

    async def unload(self, name: str) -> None:
        if name in self._loaded:
            await self._unload(name, "closed")

    async def aclose(self) -> None:
        self._is_closed = True
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        for name in list(self._loaded):
            await self._unload(name, "closed")

    # -- loading --------------------------------------------------------------------------------

    async def _acquire(self, name: str, source: str) -> _Loaded:
        while True:
            if self._is_closed:
                raise BackendUnavailable(f"{name} is shutting down", backend=name)
            loaded = self._loaded.get(name)
            if loaded is not None:
                self._loaded.move_to_end(name)
                loaded.num_in_flight += 1
                return loaded
            task = self._loading.get(name)
            if task is None:
                base_engine = self.base._engine()  # the base model must be loaded first
                folder = self._folder(name, source)
                await self._make_room(name)
                if name in self._loaded or name in self._loading:
                    continue  # another request loaded it, or began to, meanwhile
                task = asyncio.create_task(self._load(name, folder, base_engine), name=f"load-adapter:{name}")
                task.add_done_callback(_consume_exception)
                self._loading[name] = task
            # Counted until it takes the loaded adapter (no await in between): until then no other
            # adapter's request may unload it. Shielded: a request that gives up leaves the load to the rest.
            self._num_waiting[name] += 1
            try:
                await asyncio.shield(task)
            finally:
                self._num_waiting[name] -= 1

    def _folder(self, name: str, source: str) -> Path:
        from switchyard.backends.embedded.models import ModelSourceError, adapter_folder

        try:
            return adapter_folder(source)
        except ModelSourceError as exc:
            raise self._failed(name, source, exc) from exc

    async def _make_room(self, name: str) -> None:
        """Wait until one more adapter may load: stop the least recently used idle one when all slots
        are taken, or wait (up to the engine's queue timeout) for one to become idle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.base.limits.queue_timeout_s
        while len(self._loaded) + len(self._loading) + self._num_stopping >= self.max_loras:
            if name in self._loaded or name in self._loading:
                return
            idle = next((n for n, a in self._loaded.items() if a.num_in_flight == 0 and not self._num_waiting[n]), None)
            if idle is not None:
                await self._unload(idle, f"least recently used, making room for {name}")
                continue
            self.num_waiting_for_room += 1
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise BackendUnavailable(
                    f"{name} cannot load: all {self.max_loras} adapter slots of {self.base.name} are busy",
                    backend=name,
                    retry_after_s=1,
                ) from None
            finally:
                self.num_waiting_for_room -= 1

    async def _load(self, name: str, folder: Path, base_engine: EmbeddedEngine) -> None:
        from switchyard.backends.embedded.models import load_adapter_model

        started = time.monotonic()
        try:
            model = await asyncio.to_thread(load_adapter_model, base_engine.model, folder)
            engine = EmbeddedEngine(
                model, base_engine.tokenizer, self.base.limits, name=name, draft_model=base_engine.draft_model
            )
            await asyncio.to_thread(engine.start)
            if self._is_closed:
                await asyncio.to_thread(engine.stop)
                raise BackendUnavailable(f"{name} is shutting down", backend=name)
            self._loaded[name] = _Loaded(engine)
        except BackendUnavailable:
            raise
        except Exception as exc:
            raise self._failed(name, str(folder), exc) from exc
        finally:
            del self._loading[name]
            self._signal()
        self.num_loads[name] += 1
        self.load_errors.pop(name, None)
        logger.info("adapter %s of %s is loaded (%.1f s)", name, self.base.name, time.monotonic() - started)

    def _failed(self, name: str, source: str, exc: Exception) -> BackendUnavailable:
        detail = f"{type(exc).__name__}: {exc}"
        self.load_errors[name] = detail
        logger.error("adapter %s (%s) of %s failed to load: %s", name, source, self.base.name, detail)
        return BackendUnavailable(f"the LoRA adapter {name} failed to load: {detail}", backend=name)

    async def _unload(self, name: str, reason: str) -> None:
        loaded = self._loaded.pop(name)
        self._num_stopping += 1
        try:
            await asyncio.to_thread(loaded.engine.stop)
        finally:
            self._num_stopping -= 1
            self._signal()
        logger.info("adapter %s of %s is unloaded (%s)", name, self.base.name, reason)

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


def _consume_exception(task: asyncio.Task[None]) -> None:
    """A load's failure reaches the requests that wait for it, and the log; none may be left waiting."""
    if not task.cancelled():
        task.exception()


class EmbeddedAdapter(EmbeddedBackend):
    """The base model with one LoRA adapter merged in, answering under the adapter's name exactly as
    the base model answers. Ready when the base model is: it loads on its first request."""

    starts_in_background = False

    def __init__(self, base: EmbeddedBackend, pool: AdapterPool, name: str, source: str) -> None:
        super().__init__(name, base.model_spec, base.limits, default_max_tokens=base.default_max_tokens)
        self.base = base
        self.source = source
        self.pool = pool
        self.label = base.label

    async def start(self) -> None:
        """Nothing to load before the first request."""

    async def aclose(self) -> None:
        await self.pool.unload(self.name)

    def is_ready(self) -> bool:
        return self.base.is_ready() and self.name not in self.pool.load_errors

    def load_failure(self) -> str | None:
        if self.name in self.pool.load_errors:
            return "the LoRA adapter failed to load (the log says why)"
        failure = self.base.load_failure()
        return f"base model {self.base.name}: {failure}" if failure else None

    def is_saturated(self) -> bool:
        engine = self.pool.engine_of(self.name)
        return engine is not None and engine.num_waiting > 0

    def queued_tokens(self) -> int:
        engine = self.pool.engine_of(self.name)
        return engine.num_waiting_tokens if engine is not None else 0

    def _loaded_engine(self) -> EmbeddedEngine | None:
        return self.pool.engine_of(self.name)

    async def health(self) -> BackendHealth:
        base = await self.base.health()
        error = self.pool.load_errors.get(self.name)
        if not base.is_ready or error is not None:
            return BackendHealth(False, error or f"base model {self.base.name}: {base.detail}")
        engine = self.pool.engine_of(self.name)
        if engine is None:
            return BackendHealth(True, f"LoRA adapter on {self.base.name}; loads on its first request")
        used = engine.num_reserved_blocks / engine.num_total_blocks
        return BackendHealth(True, f"LoRA adapter on {self.base.name}, loaded; KV blocks reserved {used:.0%}")

    def capabilities(self) -> Capabilities:
        return self.base.capabilities()

    def adapter(self, name: str, source: str) -> Backend:
        raise NotImplementedError(f"{self.name} is an adapter already: adapters go on its base model")

    def _json_grammar(self) -> JsonGrammar:
        return self.base._json_grammar()

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """Counted by the base model, whose tokenizer the adapter shares (nothing is loaded)."""
        return await self.base.tokenize(request)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self.base.detokenize(tokens)

    @contextlib.asynccontextmanager
    async def _serving_engine(self) -> AsyncIterator[EmbeddedEngine]:
        async with self.pool.use(self.name, self.source) as engine:
            yield engine


class AdaptableEmbeddedBackend(EmbeddedBackend):
    """An embedded model that also answers as any of its LoRA adapters (`adapter`), each loaded on
    its first request into a pool of at most `max_loras` engines. What the registry builds."""

    def __init__(self, *args, max_loras: int = 2, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_loras = max_loras
        self.adapter_pool: AdapterPool | None = None  # created with the first adapter

    def adapter(self, name: str, source: str) -> Backend:
        """This model with the LoRA adapter in the folder `source` merged in, loaded on its first
        request on an engine of its own."""
        if self.adapter_pool is None:
            self.adapter_pool = AdapterPool(self, self.max_loras)
        return EmbeddedAdapter(self, self.adapter_pool, name, source)

    async def aclose(self) -> None:
        if self.adapter_pool is not None:
            await self.adapter_pool.aclose()
        await super().aclose()
