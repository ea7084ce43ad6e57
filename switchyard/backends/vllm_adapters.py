"""Which LoRA adapters each vLLM replica holds, and loading them there while it runs.

vLLM answers a request whose `model` is an adapter's `lora_name` with that adapter applied, once
`POST /v1/load_lora_adapter` loaded it (the server needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`).
What a replica holds is read from its `GET /v1/models` (adapters are the entries with a `parent`)
and kept up to date by our own loads and unloads. A replica holds at most `max_loras` of ours: a
load first unloads the least recently used one that has no request in flight (when every one has,
it loads anyway and the next load catches up). Adapters loaded by someone else are left alone.

Loads and unloads on one replica happen one at a time; concurrent first requests for an adapter
share one load, which goes on if the request that started it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from switchyard.backends.openai_http import Replica, UpstreamError
from switchyard.core.errors import BackendError, BackendRejected, BackendTimeout, BackendUnavailable

logger = logging.getLogger("switchyard.vllm")


def _vllm_error_message(body: bytes) -> str | None:
    """The message of an error body vLLM wrote (OpenAI's shape, or older versions' flat one); None
    for anything else (a proxy's page, a crash)."""
    try:
        data = orjson.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        data = data["error"]
    elif not (isinstance(data, dict) and data.get("object") == "error"):
        return None
    message = data.get("message")
    return message if isinstance(message, str) else None


def listed_adapters(body: bytes) -> set[str] | None:
    """The LoRA adapters a vLLM server's `/v1/models` lists (entries with a `parent`); None when
    the body is not such a list."""
    try:
        entries = orjson.loads(body)["data"]
        return {entry["id"] for entry in entries if entry.get("parent")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(eq=False, slots=True)
class _Held:
    """An adapter on a replica: loaded, being loaded, or placed there by a pick and not yet loaded."""

    is_loaded: bool = False
    loading: asyncio.Task[None] | None = None


@dataclass(eq=False, slots=True)
class _ReplicaAdapters:
    held: OrderedDict[str, _Held] = field(default_factory=OrderedDict)  # least recently used first
    num_in_flight: Counter[str] = field(default_factory=Counter)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one load or unload at a time
    num_changes: int = 0  # loads and unloads of ours finished: a listing read across one is stale

    def num_loaded(self, *, besides: str) -> int:
        return sum(held.is_loaded for name, held in self.held.items() if name != besides)

    def victim(self, *, besides: str | None = None) -> str | None:
        """The least recently used loaded adapter with no request in flight."""
        for name, held in self.held.items():
            if name != besides and held.is_loaded and held.loading is None and not self.num_in_flight[name]:
                return name
        return None


class LoRAAdapters:
    """The LoRA adapters of one vLLM model (`model`, its public name) across its replicas."""

    def __init__(
        self, model: str, session: aiohttp.ClientSession, *, max_loras: int, timeout: aiohttp.ClientTimeout
    ) -> None:
        self.model = model
        self.max_loras = max_loras
        self._session = session
        self._timeout = timeout
        self._sources: dict[str, str] = {}  # adapter name -> lora_path
        self._replicas: dict[Replica, _ReplicaAdapters] = {}

    def register(self, name: str, source: str) -> None:
        self._sources[name] = source

    @property
    def names(self) -> Collection[str]:
        return self._sources.keys()

    def _of(self, replica: Replica) -> _ReplicaAdapters:
        state = self._replicas.get(replica)
        if state is None:
            state = self._replicas[replica] = _ReplicaAdapters()
        return state

    # -- placement (synchronous: a pick decides before any await) -------------------------------

    def holds(self, replica: Replica, name: str) -> bool:
        """Loaded there, being loaded, or placed there by an earlier pick."""
        return name in self._of(replica).held

    def has_room(self, replica: Replica) -> bool:
        """Whether `replica` can take one more adapter without going past `max_loras`."""
        state = self._of(replica)
        return len(state.held) < self.max_loras or state.victim() is not None

    def place(self, replica: Replica, name: str) -> None:
        """Mark `name` as going to `replica`, so that the picks that follow send it there too."""
        self._of(replica).held.setdefault(name, _Held())

    def loaded_on(self, name: str) -> list[str]:
        """The labels of the replicas that have `name` loaded."""
        return sorted(
            r.label for r, state in self._replicas.items() if (held := state.held.get(name)) and held.is_loaded
        )

    # -- use ------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def using(self, replica: Replica, name: str) -> AsyncIterator[None]:
        """Around one request for `name` on `replica`: loads it there first if it is not, and
        keeps it from being unloaded until the request is over."""
        state = self._of(replica)
        state.num_in_flight[name] += 1
        try:
            await self._ensure_loaded(replica, name)
            state.held.move_to_end(name)
            yield
        finally:
            state.num_in_flight[name] -= 1
            if not state.num_in_flight[name]:
                del state.num_in_flight[name]

    async def reload(self, replica: Replica, name: str) -> None:
        """The replica said it does not know `name` (it restarted): load it again."""
        held = self._of(replica).held.get(name)
        if held is not None and held.loading is None:
            held.is_loaded = False
        await self._ensure_loaded(replica, name)

    async def _ensure_loaded(self, replica: Replica, name: str) -> None:
        state = self._of(replica)
        while True:
            held = state.held.setdefault(name, _Held())
            if held.is_loaded:
                return
            if held.loading is None:
                held.loading = asyncio.create_task(self._load(replica, state, name, held), name=f"lora-load:{name}")
                held.loading.add_done_callback(_retrieve)
            # shielded: a request that leaves does not cancel the load the others wait for
            await asyncio.shield(held.loading)

    async def _load(self, replica: Replica, state: _ReplicaAdapters, name: str, held: _Held) -> None:
        try:
            async with state.lock:
                await self._make_room(replica, state, name)
                await self._post_load(replica, name)
                held.is_loaded = True
                state.num_changes += 1
        except BaseException:
            if state.held.get(name) is held:
                del state.held[name]  # nothing recorded: the next request tries again
            raise
        finally:
            held.loading = None
        logger.info("loaded LoRA adapter %s of %s on %s", name, self.model, replica.label)

    async def _make_room(self, replica: Replica, state: _ReplicaAdapters, name: str) -> None:
        while state.num_loaded(besides=name) >= self.max_loras:
            victim = state.victim(besides=name)
            if victim is None:
                logger.warning(
                    "every LoRA adapter of %s on %s has a request in flight: loading %s past vllm.max_loras (%d)",
                    self.model,
                    replica.label,
                    name,
                    self.max_loras,
                )
                return
            del state.held[victim]
            try:
                await self._post_unload(replica, victim)
            finally:
                state.num_changes += 1

    # -- what the replica lists -----------------------------------------------------------------

    def num_changes(self, replica: Replica) -> int:
        """Read before asking a replica what it holds; pass to `sync` with the answer."""
        return self._of(replica).num_changes

    def sync(self, replica: Replica, listed: Collection[str], num_changes_before: int) -> None:
        """Take what `replica` lists (`listed_adapters`) as what it holds of ours, unless a load or
        unload of ours ran while the listing was read."""
        state = self._of(replica)
        if state.lock.locked() or state.num_changes != num_changes_before:
            return
        for name in listed:
            if name not in self._sources:
                continue  # someone else's: not ours to count or unload
            held = state.held.get(name)
            if held is None:
                state.held[name] = _Held(is_loaded=True)
                state.held.move_to_end(name, last=False)  # unused by us so far
            elif held.loading is None:
                held.is_loaded = True
        for name, held in list(state.held.items()):
            if held.is_loaded and held.loading is None and name not in listed:  # the replica restarted
                if state.num_in_flight[name]:
                    held.is_loaded = False
                else:
                    del state.held[name]

    # -- vLLM's runtime adapter API -------------------------------------------------------------

    async def _post(self, replica: Replica, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        """POST to vLLM's adapter API; a transport failure becomes ours, in the words of a load."""
        try:
            async with self._session.post(
                replica.base_url + path, data=orjson.dumps(payload), headers=replica.headers, timeout=self._timeout
            ) as response:
                return response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            where = f"{self.model} ({replica.label})"
            detail = f"POST {path} to {where} at {replica.base_url}: {type(exc).__name__}: {exc}"
            message = f"LoRA adapter '{payload['lora_name']}' could not be loaded: {where} "
            if isinstance(exc, TimeoutError):
                raise BackendTimeout(message + "timed out", backend=self.model, detail=detail) from exc
            raise BackendUnavailable(
                message + f"is unreachable ({type(exc).__name__})", backend=self.model, detail=detail
            ) from exc

    async def _post_load(self, replica: Replica, name: str) -> None:
        source = self._sources[name]
        status, body = await self._post(replica, "/load_lora_adapter", {"lora_name": name, "lora_path": source})
        if status == 200:
            return
        said = _vllm_error_message(body)
        if status == 400 and said is not None and "already been loaded" in said:
            return  # loaded before we knew (by us before a restart of ours, or from the listing's blind spot)
        where = f"{self.model} ({replica.label})"
        reason = said or UpstreamError.parse(body).message
        message = f"LoRA adapter '{name}' could not be loaded on {where}: {status} {reason}"
        detail = f"{message} (lora_path {source!r} at {replica.base_url})"
        # vLLM's own refusal (no adapter at that path: 404; one it cannot apply: 400, or 500 from newer
        # versions) is the adapter's fault, not the replica's: not retried, no breaker failure
        if status in (400, 404, 422) or (status == 500 and said is not None):
            raise BackendRejected(
                message,
                backend=self.model,
                detail=detail,
                status_code=404 if status == 404 else 400,
                code="adapter_load_failed",
                param="model",
            )
        raise BackendUnavailable(message, backend=self.model, detail=detail)

    async def _post_unload(self, replica: Replica, name: str) -> None:
        try:
            status, body = await self._post(replica, "/unload_lora_adapter", {"lora_name": name})
        except BackendError as exc:
            logger.warning("could not unload LoRA adapter %s: %s", name, exc.log_message)
            return
        if status not in (200, 404):  # 404: it was gone already
            logger.warning(
                "could not unload LoRA adapter %s of %s on %s: %s %s",
                name,
                self.model,
                replica.label,
                status,
                UpstreamError.parse(body).message,
            )
            return
        logger.info("unloaded LoRA adapter %s of %s on %s", name, self.model, replica.label)

    async def aclose(self) -> None:
        loads = [held.loading for state in self._replicas.values() for held in state.held.values() if held.loading]
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a load's failure as seen: every request that waited for it may have left (those that
    stayed got it raised)."""
    if not task.cancelled():
        task.exception()
