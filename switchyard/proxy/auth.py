"""Who is calling and what they may ask: the key's principal, the admin key, and how the caller's
requests meet a saturated backend (its priority tier, `switchyard.gateway.tiers`).

A key is a bearer token (`Authorization: Bearer <key>`), or Anthropic's `x-api-key: <key>` (what the
`anthropic` SDK and Claude Code send). The pages a browser opens (the reports)
also take it as the password of HTTP Basic auth, any user name (`allow_basic`): only pages that
read, since a browser sends Basic credentials it has cached with every request to the host.
"""

from __future__ import annotations

import base64
import binascii

from starlette.requests import Request

from switchyard.billing.directory import UnknownKey
from switchyard.billing.teams import Principal, digest, same_digest
from switchyard.core.errors import AuthenticationFailed
from switchyard.gateway.services import Services
from switchyard.gateway.tiers import priority_tier


def basic_password(authorization: str | None) -> str | None:
    """The password of `Authorization: Basic <base64 of user:password>` (None: not Basic, or malformed)."""
    scheme, _, encoded = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon and password else None


def _presented_key(request: Request, allow_basic: bool) -> str | None:
    authorization = request.headers.get("authorization")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return given.strip()
    return basic_password(authorization) if allow_basic else None


def authorization_of(request: Request) -> str | None:
    """The `Authorization` header, or Anthropic's `x-api-key` as a bearer token when there is none."""
    authorization = request.headers.get("authorization")
    if authorization is None and (api_key := request.headers.get("x-api-key", "").strip()):
        return f"Bearer {api_key}"
    return authorization


def authenticate(services: Services, request: Request, *, allow_basic: bool = False) -> Principal | None:
    """The caller (None when no team exists anywhere)."""
    try:
        password = basic_password(request.headers.get("authorization")) if allow_basic else None
        if password is not None and services.directory.is_enabled:
            return services.directory.identify(password)
        return services.directory.authenticate(authorization_of(request))
    except UnknownKey as exc:
        raise AuthenticationFailed(str(exc)) from None


def is_admin(services: Services, request: Request, *, allow_basic: bool = False) -> bool:
    """Does the request carry the admin key (`auth.admin_key`)? Compared as digests, in constant time."""
    admin_key = services.settings.auth.admin_key
    given = _presented_key(request, allow_basic)
    if admin_key is None or given is None:
        return False
    return same_digest(digest(given), digest(admin_key.get_secret_value()))


def may_scrape(services: Services, request: Request) -> bool:
    """May the request read `/metrics`? Yes when `server.metrics_public` is on or no key is
    configured anywhere (no admin key, no metrics token, no team); else only with the metrics
    token or the admin key as a bearer token, compared as digests."""
    server = services.settings.server
    admin_key = services.settings.auth.admin_key
    tokens = [secret.get_secret_value() for secret in (server.metrics_token, admin_key) if secret is not None]
    if server.metrics_public or not (tokens or services.directory.is_enabled):
        return True
    given = _presented_key(request, allow_basic=False)
    return given is not None and any(same_digest(digest(given), digest(token)) for token in tokens)


def saturation_priority(services: Services, request: Request, principal: Principal | None) -> str | None:
    """How the request meets a saturated backend: from the key's team, else the header."""
    if principal is None:
        return request.headers.get("x-switchyard-priority")
    tiers = services.settings.billing.priority_tiers
    return priority_tier(tiers, principal.team.priority).saturation
