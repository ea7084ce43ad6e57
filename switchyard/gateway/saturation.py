"""What a request does when its model's backend is saturated (vLLM's queue or KV cache, the
embedded engine's waiting requests): decided before the first byte, by the request's priority.

    best-effort  → the model's `degrade_to` model (if the team may use it, and it can serve the
                   request: tools, images, JSON schema…) answers instead; `x-switchyard-degraded: 1`
    standard     → goes ahead (the backend's own admission queues or refuses it)
    priority     → waits, in a bounded queue, up to `saturation_wait_s` for the saturation to clear

The priority comes from the key's team (`switchyard.proxy.auth.saturation_priority`), or from
`x-switchyard-priority` when no teams are configured.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from switchyard.backends.registry import ModelEntry, ModelRegistry
from switchyard.core.errors import BackendUnavailable, InvalidRequest, RateLimited
from switchyard.core.request_context import RequestContext

PRIORITIES = ("best-effort", "standard", "priority")


@dataclass(frozen=True, slots=True)
class Admission:
    entry: ModelEntry
    is_degraded: bool


def is_saturated(entry: ModelEntry) -> bool:
    return entry.backend.is_saturated()


class SaturationGate:
    def __init__(
        self,
        registry: ModelRegistry,
        degrade_to: dict[str, str],
        *,
        wait_s: float = 10.0,
        max_waiting: int = 64,
        poll_s: float = 0.05,
    ) -> None:
        self.registry = registry
        self.degrade_to = degrade_to
        self.wait_s = wait_s
        self.max_waiting = max_waiting
        self.poll_s = poll_s
        self.num_waiting = 0
        self.num_degraded = 0

    async def admit(
        self,
        entry: ModelEntry,
        priority: str | None,
        ctx: RequestContext | None = None,
        needed: dict[str, str] | None = None,
    ) -> Admission:
        """`needed`: what the request needs of a model (`core.capabilities.needs`)."""
        priority = priority or "standard"
        if priority not in PRIORITIES:
            raise InvalidRequest(
                f"x-switchyard-priority must be one of {', '.join(PRIORITIES)}, not {priority!r}.",
                param="x-switchyard-priority",
            )
        if not is_saturated(entry) or priority == "standard":
            return Admission(entry, False)
        if priority == "best-effort":
            smaller = self._degraded(entry, ctx, needed or {})
            if smaller is None:
                return Admission(entry, False)
            self.num_degraded += 1
            return Admission(smaller, True)
        return await self._wait(entry)

    def _degraded(self, entry: ModelEntry, ctx: RequestContext | None, needed: dict[str, str]) -> ModelEntry | None:
        name = self.degrade_to.get(entry.name)
        if name is None or (ctx is not None and not ctx.may_use(name)):
            return None
        smaller = self.registry.get(name)
        return None if smaller.capabilities.lacks(needed) else smaller

    async def _wait(self, entry: ModelEntry) -> Admission:
        if self.num_waiting >= self.max_waiting:
            raise RateLimited(
                f"{entry.name} is saturated and {self.num_waiting} priority requests are already waiting.",
                retry_after_s=1,
            )
        self.num_waiting += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait_s
            while is_saturated(entry):
                if loop.time() >= deadline:
                    raise BackendUnavailable(
                        f"{entry.name} stayed saturated for {self.wait_s:g} s", backend=entry.name, retry_after_s=2
                    )
                await asyncio.sleep(self.poll_s)
        finally:
            self.num_waiting -= 1
        return Admission(entry, False)
