"""The admin API's and /v1/usage's wire shapes: request bodies in, JSON views of teams, keys and
routing versions out."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from switchyard.billing.teams import LIMITS, ApiKey, Team
from switchyard.gateway.routings import Routing, Routings

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_USD = LIMITS.max_usd
MAX_PER_MINUTE = LIMITS.max_per_minute
MAX_DAYS = 36_500


class _Body(BaseModel):
    # strict: `false` is not a budget of 0, nor `"10"` a limit of 10 (an integer is a valid number)
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        return cls.model_validate(payload)


class TeamChanges(_Body):
    models: list[str] | None = None
    budget_usd_per_day: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    budget_usd_per_month: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    rpm: int | None = Field(default=None, ge=1, le=MAX_PER_MINUTE)
    tpm: int | None = Field(default=None, ge=1, le=MAX_PER_MINUTE)
    priority: str | None = None

    def changes(self) -> dict[str, Any]:
        """Only the fields the body named (null clears a budget or limit)."""
        out = {name: getattr(self, name) for name in self.model_fields_set if name != "name"}
        if "models" in out and out["models"] is not None:
            out["models"] = frozenset(out["models"])
        return out


class TeamCreate(TeamChanges):
    name: str = Field(pattern=NAME_PATTERN)


class KeyCreate(_Body):
    team: str
    budget_usd_per_day: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    budget_usd_per_month: float | None = Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)
    rpm: int | None = Field(default=None, ge=1, le=MAX_PER_MINUTE)
    tpm: int | None = Field(default=None, ge=1, le=MAX_PER_MINUTE)
    expires_in_days: float | None = Field(default=None, gt=0, le=MAX_DAYS, allow_inf_nan=False)


def _iso(at: float | None) -> str | None:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds") if at is not None else None


def team_view(team: Team) -> dict[str, Any]:
    return {
        "object": "team",
        "name": team.name,
        "models": sorted(team.models) if team.models is not None else None,
        "budget_usd_per_day": team.budget_usd_per_day,
        "budget_usd_per_month": team.budget_usd_per_month,
        "rpm": team.rpm,
        "tpm": team.tpm,
        "priority": team.priority,
        "source": team.source,
    }


def key_status(key: ApiKey, now: float | None = None) -> str:
    if key.revoked_at is not None:
        return "revoked"
    return "active" if key.is_usable(time.time() if now is None else now) else "expired"


def key_view(key: ApiKey) -> dict[str, Any]:
    return {
        "object": "api_key",
        "id": key.id,
        "team": key.team,
        "prefix": key.prefix,
        "status": key_status(key),
        "budget_usd_per_day": key.budget_usd_per_day,
        "budget_usd_per_month": key.budget_usd_per_month,
        "rpm": key.rpm,
        "tpm": key.tpm,
        "created_at": _iso(key.created_at),
        "expires_at": _iso(key.expires_at),
        "revoked_at": _iso(key.revoked_at),
    }


def routing_view(routings: Routings) -> dict[str, Any]:
    """`GET /admin/routing`: the routing versions running, and the files each was read from."""
    candidate = routings.candidate
    return {
        "object": "routing",
        "current": _version_view(routings.current),
        "candidate": _version_view(candidate) | {"share": routings.share} if candidate is not None else None,
    }


def _version_view(routing: Routing) -> dict[str, Any]:
    check = routing.check
    return {
        "version": routing.version,
        "thresholds_file": str(check.thresholds_path) if check.thresholds_path is not None else None,
        "classifier_artifact": str(check.artifact) if check.artifact is not None else None,
    }
