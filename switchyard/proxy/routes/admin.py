"""`/admin`: teams, keys, any team's usage, the analysts' report and the routing versions (reload
included), behind `auth.admin_key`.

Every route checks the admin key before anything else, so anything under /admin without it is a
401 — unknown paths and methods included. The report, a page a browser opens, also takes the key
as the password of HTTP Basic auth (`switchyard.proxy.routes.report`). Changes to teams and keys
reach this process at once and every other replica within a second (they re-read the database's
directory).
"""

from __future__ import annotations

import logging
import os
import signal

import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from switchyard.billing import admin
from switchyard.billing.store.errors import StoreError
from switchyard.billing.teams import Team
from switchyard.core.errors import InvalidRequest, NotFound
from switchyard.gateway.reload import reload_routing
from switchyard.learning.rows import delete_rows
from switchyard.proxy.admin_wire import KeyCreate, TeamChanges, TeamCreate, key_view, routing_view, team_view
from switchyard.proxy.app_state import services_of
from switchyard.proxy.body import read_request
from switchyard.proxy.openapi import json_body, query
from switchyard.proxy.routes.admin_support import database_of, require_admin
from switchyard.proxy.routes.report import REPORT_QUERY, admin_challenge, report_page
from switchyard.proxy.routes.usage import USAGE_QUERY, usage_response

logger = logging.getLogger("switchyard.admin")
router = APIRouter()


def _json(body, status_code: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status_code, media_type="application/json")


async def _refresh(request: Request) -> None:
    """This process sees the change at once (the others within a second); the change is made
    either way, so a failed re-read is only logged."""
    try:
        await services_of(request).directory.refresh()
    except StoreError as exc:
        logger.warning("teams and keys changed but could not be re-read now: %s", exc)


@router.get("/admin/teams")
async def list_teams(request: Request) -> Response:
    require_admin(request)
    services = services_of(request)
    teams = await admin.list_teams(database_of(request), services.settings)
    return _json({"object": "list", "data": [team_view(team) for team in teams]})


@router.post("/admin/teams", status_code=201, openapi_extra=json_body(TeamCreate))
async def create_team(request: Request) -> Response:
    require_admin(request)
    body = await read_request(request, TeamCreate, services_of(request).settings.server)
    team = Team(body.name, **body.changes())
    created = await admin.create_team(database_of(request), services_of(request).settings, team)
    await _refresh(request)
    return _json(team_view(created), 201)


@router.patch("/admin/teams/{name}", openapi_extra=json_body(TeamChanges))
async def update_team(request: Request, name: str) -> Response:
    require_admin(request)
    body = await read_request(request, TeamChanges, services_of(request).settings.server)
    updated = await admin.update_team(database_of(request), services_of(request).settings, name, body.changes())
    await _refresh(request)
    return _json(team_view(updated))


@router.delete("/admin/learning/rows", openapi_extra=query(("team", {"type": "string"})))
async def delete_learning_rows(request: Request) -> Response:
    """Every learning row of one team (switchyard.learning.rows): its shadowed requests and feedback."""
    require_admin(request)
    team = request.query_params.get("team")
    if not team:
        raise InvalidRequest("Name the team whose learning rows to delete: ?team=<name>.", param="team")
    num_deleted = await delete_rows(database_of(request), team=team)
    return _json({"object": "learning_rows.deleted", "team": team, "deleted": num_deleted})


@router.delete("/admin/cache", openapi_extra=query(("team", {"type": "string"})))
async def purge_response_cache(request: Request) -> Response:
    """Every response-cache entry of one team (docs/cache.md); with `cache.scope: shared`, the
    shared entries, which every team's answers went into."""
    require_admin(request)
    services = services_of(request)
    team = request.query_params.get("team")
    if not team:
        raise InvalidRequest("Name the team whose cached answers to delete: ?team=<name>.", param="team")
    if team not in services.directory.teams:
        raise NotFound(f"No team is named '{team}'.", param="team")
    cache = services.response_cache
    num_deleted = await cache.purge(team) if cache is not None else 0
    return _json({"object": "response_cache.deleted", "team": team, "deleted": num_deleted})


@router.get("/admin/keys", openapi_extra=query(("team", {"type": "string"})))
async def list_keys(request: Request) -> Response:
    require_admin(request)
    keys = await database_of(request).list_keys(request.query_params.get("team"))
    return _json({"object": "list", "data": [key_view(key) for key in keys]})


@router.post("/admin/keys", status_code=201, openapi_extra=json_body(KeyCreate))
async def create_key(request: Request) -> Response:
    require_admin(request)
    body = await read_request(request, KeyCreate, services_of(request).settings.server)
    key, record = await admin.create_key(
        database_of(request),
        services_of(request).settings,
        body.team,
        budget_usd_per_day=body.budget_usd_per_day,
        budget_usd_per_month=body.budget_usd_per_month,
        rpm=body.rpm,
        tpm=body.tpm,
        expires_in_days=body.expires_in_days,
    )
    await _refresh(request)
    return _json(key_view(record) | {"key": key}, 201)  # the only time the key is shown


@router.delete("/admin/keys/{key_id}")
async def revoke_key(request: Request, key_id: str) -> Response:
    require_admin(request)
    revoked = await admin.revoke_key(database_of(request), key_id)
    await _refresh(request)
    return _json(key_view(revoked))


@router.get("/admin/usage", openapi_extra=USAGE_QUERY)
async def usage(request: Request) -> Response:
    require_admin(request)
    team = request.query_params.get("team")
    if team is not None:
        await admin.check_known_team(database_of(request), services_of(request).directory.teams, team)
    return await usage_response(request, team)


@router.get("/admin/report", openapi_extra=REPORT_QUERY, response_class=HTMLResponse)
async def report(request: Request) -> Response:
    """The analysts' report as one self-contained page (what `switchyard report` writes as report.html).
    A browser opens it: the admin key is also taken as the password of HTTP Basic auth."""
    refused = admin_challenge(request)
    if refused is not None:
        return refused
    return await report_page(request, request.query_params.get("team"))


@router.get("/admin/routing")
async def routing(request: Request) -> Response:
    """The routing versions running: the current one, and the candidate during a rollout."""
    require_admin(request)
    return _json(routing_view(services_of(request).routings))


@router.post("/admin/reload")
async def reload(request: Request) -> Response:
    """Read the thresholds file(s) and classifier artifact(s) again and route by what they hold
    (a 400 `reload_refused` keeps the old ones, saying why). One of `serve --workers N`: the
    parent is then asked (SIGHUP) to reload every worker."""
    require_admin(request)
    reloaded = await reload_routing(services_of(request))
    parent_pid = request.app.state.reload_parent_pid
    if parent_pid is not None:
        os.kill(parent_pid, signal.SIGHUP)
    body = routing_view(reloaded.routings) | {
        "changed": reloaded.is_changed,
        "previous": routing_view(reloaded.previous),
        "workers": "signalled" if parent_pid is not None else "this process",
    }
    return _json(body)


class _Unknown:
    """Any other path under /admin, by any method (TRACE and QUERY included): an ASGI app rather
    than a function, because Starlette serves a function GET only. Without the admin key it is a
    401 before it is a 404."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        require_admin(request)
        allowed = _methods_served(scope)
        if allowed:
            raise HTTPException(405, headers={"Allow": ", ".join(allowed)})
        raise NotFound(f"No admin endpoint {request.method} {request.url.path}.")


def _methods_served(scope: Scope) -> list[str]:
    """The methods the other admin routes serve at this path (none: the path does not exist)."""
    matched = (r for r in router.routes if isinstance(r, APIRoute) and r.matches(scope)[0] is Match.PARTIAL)
    return sorted({method for route in matched for method in route.methods or ()})


# Starlette's Route serves an ASGI app as well as a function; add_route's annotation names only a function.
router.add_route("/admin", _Unknown(), include_in_schema=False)  # type: ignore[arg-type]
router.add_route("/admin/{path:path}", _Unknown(), include_in_schema=False)  # type: ignore[arg-type]
