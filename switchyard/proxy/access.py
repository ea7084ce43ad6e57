"""Who is calling and what they may ask: the key's principal, its priority tier, its rate limits.

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

from fastapi import Request

from switchyard.billing.directory import UnknownKey
from switchyard.billing.teams import Principal, digest, same_digest
from switchyard.core.errors import AuthenticationFailed, InvalidRequest, RateLimited
from switchyard.core.estimates import answer_budget, estimated_tokens
from switchyard.core.protocol import ChatCompletionRequest, CompletionRequest
from switchyard.core.settings import PriorityTierSettings
from switchyard.proxy.request_log import note_caller

BUILT_IN_TIERS = {
    "interactive": PriorityTierSettings(saturation="standard"),
    "batch": PriorityTierSettings(saturation="best-effort"),
}


def authenticate(request: Request) -> Principal | None:
    """The caller (None when no team exists anywhere)."""
    try:
        principal = request.app.state.services.directory.authenticate(request.headers.get("authorization"))
    except UnknownKey as exc:
        raise AuthenticationFailed(str(exc)) from None
    note_caller(request.scope, principal)
    return principal


def is_admin(request: Request) -> bool:
    """Does the request carry the admin key (`auth.admin_key`)?"""
    admin_key = request.app.state.services.settings.auth.admin_key
    if admin_key is None:
        return False
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and same_digest(digest(given.strip()), digest(admin_key.get_secret_value()))


def priority_tier(tiers: dict[str, PriorityTierSettings], name: str) -> PriorityTierSettings:
    return tiers.get(name) or BUILT_IN_TIERS.get(name) or BUILT_IN_TIERS["interactive"]


def saturation_priority(request: Request, principal: Principal | None) -> str | None:
    """How the request meets a saturated backend: from the key's team, else the header."""
    if principal is None:
        return request.headers.get("x-switchyard-priority")
    tiers = request.app.state.services.settings.billing.priority_tiers
    return priority_tier(tiers, principal.team.priority).saturation


class TierSlots:
    """Requests running now per priority tier, for the tiers with `max_concurrency` (this process)."""

    def __init__(self, tiers: dict[str, PriorityTierSettings]) -> None:
        self.tiers = tiers
        self.running: Counter[str] = Counter()

    def enter(
        self, principal: Principal | None, parsed: ChatCompletionRequest | CompletionRequest
    ) -> Callable[[], None] | None:
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
        released = []

        def release() -> None:
            if not released:
                released.append(True)
                self.running[name] -= 1

        return release
