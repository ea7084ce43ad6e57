"""`GET /v1/usage`: a team's own cost and tokens, from the ledger's daily aggregate.

A key reads its own team's usage; naming another team is a 403. The admin key may name any team
(or none: every team). With no teams configured, the proxy is open and so is its usage.
"""

from __future__ import annotations

import datetime as dt

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.billing.admin import check_known_team
from switchyard.billing.store.schema import USAGE_GROUPS
from switchyard.billing.teams import Principal
from switchyard.core.errors import Forbidden, InvalidRequest
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate, is_admin
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import query
from switchyard.proxy.routes.admin_support import database_of

router = APIRouter(route_class=LoggedRoute)

GROUPS = USAGE_GROUPS
USAGE_QUERY = query(
    ("start_date", {"type": "string", "format": "date"}),
    ("end_date", {"type": "string", "format": "date"}),
    ("group_by", {"type": "string", "enum": list(GROUPS)}),
    ("team", {"type": "string"}),
)


def _date(value: str | None, param: str) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be a date like 2026-11-23, not {value!r}.", param=param) from None


def usage_period(start: dt.date | None, end: dt.date | None, today: dt.date) -> tuple[dt.date, dt.date]:
    """The days asked for, either end open: start_date alone runs to today (or is that one day, when
    it is later); end_date alone starts on the first of its month; neither is this month so far."""
    if start is None:
        start = (end or today).replace(day=1)
    if end is None:
        end = max(today, start)
    if end < start:
        raise InvalidRequest(f"end_date {end} is before start_date {start}.", param="end_date")
    return start, end


async def usage_response(request: Request, team: str | None) -> Response:
    params = request.query_params
    start, end = usage_period(
        _date(params.get("start_date"), "start_date"),
        _date(params.get("end_date"), "end_date"),
        dt.datetime.now(dt.UTC).date(),
    )
    group_by = params.get("group_by")
    if group_by is not None and group_by not in GROUPS:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUPS)}, not {group_by!r}.", param="group_by")
    summary = await database_of(request).usage_summary(start, end, group_by=group_by, team=team)
    if group_by == "key":  # the key's shown prefix beside its id: what its owner recognises
        directory = services_of(request).directory
        for row in summary["data"]:
            key = directory.key(row["key"]) if row["key"] is not None else None
            row["key_prefix"] = key.prefix if key is not None else None
    return Response(orjson.dumps(summary), media_type="application/json")


def own_team(principal: Principal, asked: str | None, what: str) -> str:
    """The team a team's key reads `what` of: its own; naming another is a 403."""
    if asked is not None and asked != principal.team.name:
        raise Forbidden(
            f"Your key belongs to team '{principal.team.name}'; it may not read the {what} of team '{asked}'.",
            param="team",
        )
    return principal.team.name


@router.get("/v1/usage", openapi_extra=USAGE_QUERY)
async def usage(request: Request) -> Response:
    asked = request.query_params.get("team")
    if is_admin(services_of(request), request):
        if asked is not None:
            await check_known_team(database_of(request), services_of(request).directory.teams, asked)
        return await usage_response(request, asked)
    principal = authenticate(services_of(request), request)
    if principal is None:  # an open proxy: no teams, no secrets between them
        return await usage_response(request, asked)
    return await usage_response(request, own_team(principal, asked, "usage"))
