"""`GET /metrics`: the app's Prometheus registry (`switchyard.gateway.gauges`), text format."""

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from switchyard.gateway.gauges import CONTENT_TYPE_LATEST, exposition
from switchyard.proxy.app_state import services_of
from switchyard.proxy.openapi import NO_KEY

router = APIRouter()


@router.get("/metrics", response_class=PlainTextResponse, openapi_extra=NO_KEY)
async def metrics(request: Request) -> Response:
    return Response(await exposition(services_of(request)), media_type=CONTENT_TYPE_LATEST)
