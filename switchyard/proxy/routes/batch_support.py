"""What the files and batches endpoints share: the batch tier (or a 503 naming what turns it on),
who is asking, and what they may see: their team's files and batches; the admin key sees all."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from switchyard.batch.tier import BatchTier
from switchyard.core.errors import InvalidRequest, NotConfigured
from switchyard.proxy.app_state import batch_of, services_of
from switchyard.proxy.auth import authenticate, is_admin


def batch_tier_of(request: Request) -> BatchTier:
    batch = batch_of(request)
    if batch is not None:
        return batch
    services = services_of(request)
    if services.settings.billing.resolved_database_url() is not None:
        raise NotConfigured(
            "The batch API needs Valkey or Redis for its queue: set billing.redis_url "
            "(or leave it out, and `switchyard serve` starts a private Valkey)."
        )
    raise NotConfigured(
        "The batch API needs a database for its files: set billing.database_url (or billing.ledger_path)."
    )


@dataclass(frozen=True, slots=True)
class Caller:
    team: str  # the team that owns what it creates ("" when no teams are configured)
    key_id: str | None
    sees_all: bool = False  # the admin key

    def may_see(self, team: str) -> bool:
        return self.sees_all or team == self.team


def caller_of(request: Request) -> Caller:
    services = services_of(request)
    if is_admin(services, request):
        return Caller("", None, sees_all=True)
    principal = authenticate(services, request)
    if principal is None:  # an open proxy: no teams, no secrets between them
        return Caller("", None)
    return Caller(principal.team.name, principal.key.id)


def creator_of(request: Request) -> Caller:
    """Who creates a file or batch: a team's key (the admin key belongs to no team)."""
    caller = caller_of(request)
    if caller.sees_all and services_of(request).directory.is_enabled:
        raise InvalidRequest("Upload files and create batches with a team's key: the admin key belongs to no team.")
    return caller


def page_limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be a whole number from 1 to {most}, not {raw!r}.", param="limit")
    return int(raw)
