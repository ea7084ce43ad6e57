"""`POST /v1/feedback`: a team scores one of its own answers; the score joins the learning rows
(switchyard.learning.feedback)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.learning.feedback import record_feedback
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate
from switchyard.proxy.body import read_request
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.feedback_wire import FeedbackCreate
from switchyard.proxy.openapi import json_body
from switchyard.proxy.routes.admin_support import database_of

router = APIRouter(route_class=LoggedRoute)


@router.post("/v1/feedback", openapi_extra=json_body(FeedbackCreate))
async def create_feedback(request: Request) -> Response:
    services = services_of(request)
    principal = authenticate(services, request)
    body = await read_request(request, FeedbackCreate, services.settings.server)
    await record_feedback(services, database_of(request), principal, body.request_id, body.score)
    view = {"object": "feedback", "request_id": body.request_id, "score": body.score}
    return Response(orjson.dumps(view), media_type="application/json")
