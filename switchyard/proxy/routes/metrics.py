"""`GET /metrics`: the app's Prometheus registry (`switchyard.gateway.gauges`), text format.

Open while the config has no key; once it has one, a bearer token (`server.metrics_token` or the
admin key) is needed, unless `server.metrics_public` is on (`switchyard.proxy.auth.may_scrape`).
"""

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from switchyard.core.errors import AuthenticationFailed
from switchyard.gateway.gauges import CONTENT_TYPE_LATEST, exposition
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import may_scrape
from switchyard.proxy.error_response import error_response

router = APIRouter()

BEARER_CHALLENGE = {"www-authenticate": 'Bearer realm="switchyard-metrics"'}


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    services = services_of(request)
    if not may_scrape(services, request):
        response = error_response(
            AuthenticationFailed(
                "/metrics needs a token: send 'Authorization: Bearer <server.metrics_token>' (or the admin key); "
                "server.metrics_public: true opens it to everyone who can reach the port."
            )
        )
        response.headers.update(BEARER_CHALLENGE)
        return response
    return Response(await exposition(services), media_type=CONTENT_TYPE_LATEST)
