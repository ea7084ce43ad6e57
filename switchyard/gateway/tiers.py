"""Priority tiers: what a caller's requests may ask, and how they meet saturation.

Priority comes from the key's team (`teams.<name>.priority`): `interactive` (the default) goes
ahead when a backend is saturated, `batch` gives way to a smaller model (`degrade_to`), and a tier
named in `billing.priority_tiers` says how it meets saturation and caps what its requests may ask
(max_tokens, prompt plus max_tokens; a request that sets no max_tokens gets the cap) and how many
may run at once in one proxy process. Callers
without a key (no teams configured) keep the `x-switchyard-priority` header.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from switchyard.billing.teams import Principal
from switchyard.core.errors import InvalidRequest, RateLimited
from switchyard.core.estimates import answer_budget, estimated_tokens
from switchyard.core.requests import AnyRequest
from switchyard.core.settings import PriorityTierSettings

BUILT_IN_TIERS = {
    "interactive": PriorityTierSettings(saturation="standard"),
    "batch": PriorityTierSettings(saturation="best-effort"),
}


def priority_tier(tiers: dict[str, PriorityTierSettings], name: str) -> PriorityTierSettings:
    return tiers.get(name) or BUILT_IN_TIERS.get(name) or BUILT_IN_TIERS["interactive"]


class TierSlots:
    """Requests running now per priority tier, for the tiers with `max_concurrency` (this process)."""

    def __init__(self, tiers: dict[str, PriorityTierSettings]) -> None:
        self.tiers = tiers
        self.running: Counter[str] = Counter()

    def enter(self, principal: Principal | None, parsed: AnyRequest) -> Callable[[], None] | None:
        """Check the tier's caps and take a slot; the returned callable gives it back (None: no slot)."""
        if principal is None:
            return None
        name = principal.team.priority
        tier = priority_tier(self.tiers, name)
        wanted = answer_budget(parsed)
        if tier.max_tokens is not None and wanted is None:  # no length asked for: the tier's cap is it
            parsed.set_field("max_tokens", tier.max_tokens)
        elif tier.max_tokens is not None and wanted is not None and wanted > tier.max_tokens:
            raise InvalidRequest(
                f"Priority tier '{name}' allows at most {tier.max_tokens} max_tokens; this request asks for {wanted}.",
                param="max_tokens",
            )
        if tier.context_tokens is not None and (needed := estimated_tokens(parsed)) > tier.context_tokens:
            raise InvalidRequest(
                f"Priority tier '{name}' allows about {tier.context_tokens} tokens of prompt plus max_tokens; "
                f"this request needs about {needed}.",
                param="messages",
                code="context_length_exceeded",
            )
        if tier.max_concurrency is None:
            return None
        if self.running[name] >= tier.max_concurrency:
            raise RateLimited(
                f"Priority tier '{name}' already has {tier.max_concurrency} requests running; try again shortly.",
                retry_after_s=1,
            )
        self.running[name] += 1
        released: list[bool] = []

        def release() -> None:
            if not released:
                released.append(True)
                self.running[name] -= 1

        return release
