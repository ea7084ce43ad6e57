"""`GET /v1/usage`: a team's own cost and tokens, from the ledger's daily aggregate.

A key reads its own team's usage; naming another team is a 403. The admin key may name any team
(or none: every team). With no teams configured, the proxy is open and so is its usage.
"""

from __future__ import annotations

import datetime as dt

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.errors import Forbidden, InvalidRequest, NotFound
from switchyard.proxy.access import authenticate, is_admin
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import query
from switchyard.proxy.routes.admin_support import database_of
from switchyard.proxy.services import services_of

router = APIRouter(route_class=LoggedRoute)

GROUPS = ("model", "day")
USAGE_QUERY = query(
    ("start_date", {"type": "string", "format": "date"}),
    ("end_date", {"type": "string", "format": "date"}),
    ("group_by", {"type": "string", "enum": list(GROUPS)}),
    ("team", {"type": "string"}),
)


def _date(value: str | None, param: str, default: dt.date) -> dt.date:
    if value is None:
        return default
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be a date like 2026-11-23, not {value!r}.", param=param) from None


async def usage_response(request: Request, team: str | None) -> Response:
    params = request.query_params
    today = dt.datetime.now(dt.UTC).date()
    start = _date(params.get("start_date"), "start_date", today.replace(day=1))
    end = _date(params.get("end_date"), "end_date", today)
    if end < start:
        raise InvalidRequest(f"end_date {end} is before start_date {start}.", param="end_date")
    group_by = params.get("group_by")
    if group_by is not None and group_by not in GROUPS:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUPS)}, not {group_by!r}.", param="group_by")
    summary = await database_of(request).usage_summary(start, end, group_by=group_by, team=team)
    return Response(orjson.dumps(summary), media_type="application/json")


@router.get("/v1/usage", openapi_extra=USAGE_QUERY)
async def usage(request: Request) -> Response:
    asked = request.query_params.get("team")
    if is_admin(services_of(request), request):
        if asked is not None and asked not in services_of(request).directory.teams:
            raise NotFound(f"No team '{asked}'.", param="team")
        return await usage_response(request, asked)
    principal = authenticate(services_of(request), request)
    if principal is None:  # an open proxy: no teams, no secrets between them
        return await usage_response(request, asked)
    if asked is not None and asked != principal.team.name:
        raise Forbidden(
            f"Your key belongs to team '{principal.team.name}'; it may not read the usage of team '{asked}'.",
            param="team",
        )
    return await usage_response(request, principal.team.name)
