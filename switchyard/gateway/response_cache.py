"""The response cache on the request path (docs/cache.md): looked up after routing and before any
model is called, its answer replayed whole or as a stream, and a completed answer kept.

The policy says whether a request may use it (`switchyard.cache.policy`); the keys name it
(`switchyard.cache.keys`); a semantic lookup embeds the last user turn (`cache.embedder`: the
classifier's static table by default, or the process's one MiniLM, off the event loop) and takes a
neighbour only when it is similar enough and the guard finds nothing that makes the two questions
different.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from switchyard.backends.assemble import AnswerAssembler
from switchyard.backends.embedded.minilm import shared_minilm
from switchyard.cache.entries import CachedAnswer, CacheStore
from switchyard.cache.guard import guard_reason
from switchyard.cache.keys import RequestKeys, request_keys
from switchyard.cache.policy import CachePolicy, Verdict
from switchyard.classifier.embedder import shared_static_embedder
from switchyard.core.chat_wire import ChatCompletionRequest, StreamChunk
from switchyard.core.errors import BackendError

logger = logging.getLogger("switchyard")

CACHE_HEADER = "x-switchyard-cache"
NEIGHBOURS = 4  # semantic candidates the guard reads, most similar first

EmbedText = Callable[[str], Awaitable[np.ndarray]]


async def embed_with_minilm(text: str) -> np.ndarray:
    """The last user turn's L2-normalised MiniLM vector, computed on a worker thread (~20 ms of a core)."""

    def encode() -> np.ndarray:
        vector = shared_minilm().encode([text], normalize_embeddings=True)[0]
        return np.asarray(vector, dtype=np.float32)

    return await asyncio.to_thread(encode)


async def embed_with_static(text: str) -> np.ndarray:
    """The last user turn's L2-normalised static vector: the classifier's table (~0.03 ms, on the
    loop), read on a worker thread the first time."""
    embedder = shared_static_embedder()
    if embedder.is_loaded:
        return embedder.encode([text])[0]
    return (await asyncio.to_thread(embedder.encode, [text]))[0]


EMBEDDINGS: dict[str, EmbedText] = {"static": embed_with_static, "minilm": embed_with_minilm}


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the cache did with one request it could serve: its verdict, its keys and scope, and
    the entry that answers it (a hit) or None (a miss, or a bypass)."""

    verdict: Verdict
    scope: str = ""
    keys: RequestKeys | None = None
    vector: np.ndarray | None = None
    hit: CachedAnswer | None = None
    similarity: float | None = None  # a semantic hit's
    guarded: str | None = None  # a semantic neighbour the guard refused: why (for the log)

    @property
    def result(self) -> str:
        """hit | miss | bypass"""
        if self.verdict == "bypass":
            return "bypass"
        return "hit" if self.hit is not None else "miss"

    def header(self) -> dict[str, str]:
        value = self.result
        if self.similarity is not None:
            value += f"; similarity={self.similarity:.2f}"
        return {CACHE_HEADER: value}


class ResponseCache:
    def __init__(self, policy: CachePolicy, store: CacheStore, embed: EmbedText | None = None) -> None:
        self.policy = policy
        self.store = store
        self.embed = embed or EMBEDDINGS[policy.settings.embedder]
        self._writes: set[asyncio.Task] = set()  # answers being kept

    async def warm(self) -> None:
        """Load the embedder before the first semantic request needs it (off the event loop)."""
        if self.policy.is_semantic_anywhere:
            await self.embed("warm")

    def num_entries(self) -> int:
        """Entries in this process's store (0 for a store shared elsewhere, which /metrics cannot count cheaply)."""
        size = getattr(self.store, "__len__", None)
        return int(size()) if size is not None else 0

    async def purge(self, team: str) -> int:
        """Drop the entries `team`'s requests would be answered from; how many there were."""
        return await self.store.purge(self.policy.scope_of(team))

    async def look_up(
        self, request: object, route: str, model: str, team: str | None, *, client_refuses: bool
    ) -> Lookup | None:
        """None: the cache has nothing to do with this request (no header either)."""
        verdict = self.policy.verdict(request, route, team, client_refuses=client_refuses)
        if verdict == "off":
            return None
        if verdict == "bypass":
            return Lookup("bypass")
        assert isinstance(request, ChatCompletionRequest)
        keys = request_keys(request, route, model)
        scope = self.policy.scope_of(team)
        found = await self.store.get(scope, keys.exact)
        if found is not None or verdict != "semantic" or keys.context is None:
            return Lookup(verdict, scope, keys, hit=found)
        vector = await self.embed(keys.asked)
        guarded = None
        for candidate in await self.store.nearest(scope, keys.context, vector, NEIGHBOURS):
            if candidate.similarity < self.policy.similarity:
                break
            reason = guard_reason(keys.asked, candidate.answer.prompt_text or "")
            if reason is None:
                return Lookup(verdict, scope, keys, vector, candidate.answer, candidate.similarity)
            guarded = guarded or reason
        return Lookup(verdict, scope, keys, vector, guarded=guarded)

    def keep(
        self, lookup: Lookup, body: bytes, *, model: str, deployment: str, usage: dict[str, Any] | None, cost_usd: float
    ) -> None:
        """A miss's completed answer (a chat.completion's JSON), kept for the next asker: written
        beside the request, not before its answer is sent (a write to Valkey is a round trip)."""
        if lookup.keys is None or lookup.hit is not None:
            return
        write = asyncio.get_running_loop().create_task(
            self._keep(lookup, body, model=model, deployment=deployment, usage=usage, cost_usd=cost_usd)
        )
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _written(self, write: asyncio.Task) -> None:
        self._writes.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            logger.warning("response cache: an answer could not be kept: %r", exc)

    async def settle(self) -> None:
        """Wait for the answers still being written (at shutdown, before the store closes)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def _keep(
        self, lookup: Lookup, body: bytes, *, model: str, deployment: str, usage: dict[str, Any] | None, cost_usd: float
    ) -> None:
        assert lookup.keys is not None
        usage = usage or {}
        answer = CachedAnswer(
            body=body,
            model=model,
            deployment=deployment,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cost_usd=cost_usd,
            created_at=time.time(),
            prompt_text=lookup.keys.asked if lookup.verdict == "semantic" else None,
        )
        semantic = lookup.verdict == "semantic" and lookup.keys.context is not None
        vector = lookup.vector
        if semantic and vector is None:  # an exact-mode neighbour could not be found without it
            vector = await self.embed(lookup.keys.asked)
        await self.store.put(
            lookup.scope,
            lookup.keys.exact,
            answer,
            self.policy.settings.ttl_s,
            context=lookup.keys.context if semantic else None,
            vector=vector if semantic else None,
        )


def fresh_answer(answer: CachedAnswer) -> dict[str, Any]:
    """The stored chat.completion with a new id and creation time (a hit is a new answer)."""
    data: dict[str, Any] = orjson.loads(answer.body)
    data["id"] = "chatcmpl-" + uuid.uuid4().hex
    data["created"] = int(time.time())
    return data


def replayed_chunks(answer: dict[str, Any]) -> Iterator[StreamChunk]:
    """A whole chat.completion as the chunks a live stream of it would have been: the role, the
    content (with its logprobs) and tool calls, the finish, then the usage in a chunk of its own."""
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"]}
    head["model"] = answer.get("model", "")
    if answer.get("system_fingerprint") is not None:
        head["system_fingerprint"] = answer["system_fingerprint"]

    def chunk(choices: list[dict[str, Any]]) -> StreamChunk:
        return StreamChunk.from_dict({**head, "choices": choices})

    for choice in answer.get("choices") or ():
        index, message = choice.get("index", 0), choice.get("message") or {}
        yield chunk([{"index": index, "delta": {"role": message.get("role", "assistant"), "content": ""}}])
        delta = {k: v for k, v in message.items() if k not in ("role", "tool_calls", "function_call") and v is not None}
        if delta:
            logprobs = choice.get("logprobs")
            yield chunk([{"index": index, "delta": delta, **({"logprobs": logprobs} if logprobs else {})}])
        for i, call in enumerate(message.get("tool_calls") or ()):
            yield chunk([{"index": index, "delta": {"tool_calls": [{"index": i, **call}]}}])
        if message.get("function_call"):
            yield chunk([{"index": index, "delta": {"function_call": message["function_call"]}}])
        yield chunk([{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason") or "stop"}])
    if answer.get("usage") is not None:
        yield StreamChunk.from_dict({**head, "choices": [], "usage": answer["usage"]})


class StreamKeeper:
    """A miss's stream, assembled from its chunks as they pass, and kept when it ended normally."""

    __slots__ = ("assembler", "cache", "deployment", "is_broken", "lookup", "model")

    def __init__(self, cache: ResponseCache, lookup: Lookup, model: str, deployment: str) -> None:
        self.cache, self.lookup, self.model, self.deployment = cache, lookup, model, deployment
        self.assembler = AnswerAssembler(deployment, model)
        self.is_broken = False

    def add(self, chunk: StreamChunk) -> None:
        if self.is_broken:
            return
        try:
            self.assembler.add(chunk)
        except BackendError:  # not an answer the cache can replay; the stream itself goes on
            self.is_broken = True

    def keep(self, cost_usd: float) -> None:
        """The stream completed: keep its answer."""
        if self.is_broken or self.assembler.first is None:
            return
        result = self.assembler.result()
        self.cache.keep(
            self.lookup,
            result.data,
            model=self.model,
            deployment=self.deployment,
            usage=self.assembler.usage,
            cost_usd=cost_usd,
        )
