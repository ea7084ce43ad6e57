"""Who is calling and what they may ask: the key's principal, the admin key, and how the caller's
requests meet a saturated backend (its priority tier, `switchyard.proxy.tiers`)."""

from __future__ import annotations

from starlette.requests import Request

from switchyard.billing.directory import UnknownKey
from switchyard.billing.teams import Principal, digest, same_digest
from switchyard.core.errors import AuthenticationFailed
from switchyard.proxy.services import Services
from switchyard.proxy.tiers import priority_tier


def authenticate(services: Services, request: Request) -> Principal | None:
    """The caller (None when no team exists anywhere)."""
    try:
        return services.directory.authenticate(request.headers.get("authorization"))
    except UnknownKey as exc:
        raise AuthenticationFailed(str(exc)) from None


def is_admin(services: Services, request: Request) -> bool:
    """Does the request carry the admin key (`auth.admin_key`)?"""
    admin_key = services.settings.auth.admin_key
    if admin_key is None:
        return False
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and same_digest(digest(given.strip()), digest(admin_key.get_secret_value()))


def saturation_priority(services: Services, request: Request, principal: Principal | None) -> str | None:
    """How the request meets a saturated backend: from the key's team, else the header."""
    if principal is None:
        return request.headers.get("x-switchyard-priority")
    tiers = services.settings.billing.priority_tiers
    return priority_tier(tiers, principal.team.priority).saturation
