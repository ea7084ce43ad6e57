"""The analysts' report as a page a browser opens: any team's for the admin key (`/admin/report`,
routed with the admin API), a team's own for its key (`GET /v1/usage/report`).

Both take the key as a bearer token or as the password of HTTP Basic auth, any user name. Without a
valid one the answer is a 401 with `WWW-Authenticate: Basic realm="switchyard"`, which makes a
browser ask for it: a page for a browser (one that accepts HTML), OpenAI's error body for the others.
"""

from __future__ import annotations

import datetime as dt
from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from switchyard.billing.admin import check_known_team
from switchyard.core.errors import AuthenticationFailed, InvalidRequest, SwitchyardError
from switchyard.core.model_settings import hosting_overrides
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate, is_admin
from switchyard.proxy.error_response import error_response
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import BEARER_OR_BASIC, query
from switchyard.proxy.routes.admin_support import database_of
from switchyard.proxy.routes.usage import own_team

router = APIRouter(route_class=LoggedRoute)

REPORT_QUERY = (
    query(
        ("since", {"type": "string", "format": "date"}),
        ("until", {"type": "string", "format": "date"}),
        ("team", {"type": "string"}),
    )
    | BEARER_OR_BASIC
)
BASIC_CHALLENGE = {"www-authenticate": 'Basic realm="switchyard"'}


def challenge(request: Request, error: SwitchyardError) -> Response:
    """The 401 that asks a browser for the key (its password)."""
    if "text/html" in request.headers.get("accept", ""):
        page = (
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Switchyard: sign in</title></head>'
            f"<body><h1>401: a key is needed</h1><p>{escape(error.message)}</p><p>Sign in with any user name and "
            "the key as the password.</p></body></html>\n"
        )
        return HTMLResponse(page, status_code=401, headers=BASIC_CHALLENGE)
    response = error_response(error)
    response.headers.update(BASIC_CHALLENGE)
    return response


def admin_challenge(request: Request) -> Response | None:
    """None when the request carries the admin key (a bearer token or Basic password), else the 401."""
    services = services_of(request)
    if services.settings.auth.admin_key is None:
        return error_response(
            AuthenticationFailed("The admin API is off: set auth.admin_key in the configuration to use it.")
        )
    if is_admin(services, request, allow_basic=True):
        return None
    return challenge(
        request,
        AuthenticationFailed(
            "This page needs the admin key: as the password of HTTP Basic auth (any user name), "
            "or as 'Authorization: Bearer <auth.admin_key>'."
        ),
    )


def _day(request: Request, param: str) -> dt.date | None:
    value = request.query_params.get(param)
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{param} must be a date like 2026-11-23, not {value!r}.", param=param) from None


def _start_of(day: dt.date | None, *, days: int = 0) -> float | None:
    if day is None:
        return None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() + days * 86_400


async def report_page(request: Request, team: str | None) -> HTMLResponse:
    """The report of `team` (None: every team) over `since`..`until`, as `switchyard report` writes report.html."""
    from switchyard.billing.report import DriftReferences, build_report, previous_period
    from switchyard.learning.rows import judged_answers

    database = database_of(request)
    services = services_of(request)
    since, until = _day(request, "since"), _day(request, "until")
    if team is not None:
        await check_known_team(database, services.directory.teams, team)
    before = previous_period(since, until)
    built = await build_report(
        database.iter_usage(_start_of(since), _start_of(until, days=1), team),  # `until` is inclusive
        prices=services.prices,
        key_prefixes={key.id: key.prefix for key in services.directory.keys()},
        since=since,
        until=until,
        team=team,
        hosting=hosting_overrides(services.settings.models),
        previous_batches=(
            database.iter_usage(_start_of(before[0]), _start_of(before[1], days=1), team) if before else None
        ),
        drift=DriftReferences.of(
            services.thresholds,
            psi_alert=services.settings.drift.psi_alert,
            min_samples=services.settings.drift.min_samples,
        ),
        judged=await judged_answers(database, since=_start_of(since), until=_start_of(until, days=1)),
    )
    return HTMLResponse(built.html())


@router.get("/v1/usage/report", openapi_extra=REPORT_QUERY, response_class=HTMLResponse)
async def team_report(request: Request) -> Response:
    """The report of the key's own team; the admin key may name any team, or none for every team."""
    services = services_of(request)
    asked = request.query_params.get("team")
    if is_admin(services, request, allow_basic=True):
        return await report_page(request, asked)  # an unknown team: 404 (report_page)
    try:
        principal = authenticate(services, request, allow_basic=True)
    except AuthenticationFailed as exc:
        return challenge(request, exc)
    if principal is None:  # an open proxy: no teams, no secrets between them
        return await report_page(request, asked)
    return await report_page(request, own_team(principal, asked, "report"))
