"""The cache stores the conformance suite runs against, and what their tests share.

`STORES` names each kind of store: its factory (given the test's Valkey, which a store that keeps
its entries elsewhere ignores, and `max_entries`: a new store) and whether two stores it makes on
one Valkey are two replicas of one shared cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from switchyard.cache.entries import CachedAnswer, CacheStore
from switchyard.cache.memory_store import MemoryStore
from switchyard.cache.valkey_store import ValkeyStore
from tests.servers.valkey import EmbeddedValkey


@dataclass(frozen=True)
class StoreKind:
    make: Callable[[EmbeddedValkey, int], CacheStore]
    is_shared: bool  # two stores made on one Valkey see each other's entries (replicas)


# timeout_s: a slow answer on a busy machine is not an outage
STORES: dict[str, StoreKind] = {
    "memory": StoreKind(lambda valkey, num: MemoryStore(num), False),
    "valkey": StoreKind(lambda valkey, num: ValkeyStore(valkey.url, max_entries=num, timeout_s=30.0), True),
    "valkey-no-mirror": StoreKind(
        lambda valkey, num: ValkeyStore(valkey.url, max_entries=num, timeout_s=30.0, mirror=False), True
    ),
}
SHARED_STORES = [name for name, kind in STORES.items() if kind.is_shared]

DIMENSION = 384
LONG_TTL_S = 600.0


def answer(text: str, *, prompt_text: str | None = None) -> CachedAnswer:
    body = (
        '{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,'
        f'"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"stop"}}]}}'
    )
    return CachedAnswer(
        body=body.encode(),
        model="local-small",
        deployment="openai#0",
        prompt_tokens=12,
        completion_tokens=7,
        cost_usd=0.000125,
        created_at=time.time(),
        prompt_text=prompt_text,
    )


def unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def basis(i: int) -> np.ndarray:
    vector = np.zeros(DIMENSION, dtype=np.float32)
    vector[i] = 1.0
    return vector


def toward(cosine: float, i: int = 0, j: int = 1) -> np.ndarray:
    """A unit vector whose cosine with `basis(i)` is `cosine` (it leans toward `basis(j)`)."""
    return unit(cosine * basis(i) + np.sqrt(1 - cosine**2) * basis(j))
