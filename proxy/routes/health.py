import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter()


@router.get("/health/live")
async def live() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    """Ready when at least one model has a backend that passed its last health probe.

    `breakers` shows each model's circuit breaker: closed, open or half-open.
    """
    models = {entry.name: entry.backend.is_ready() for entry in request.app.state.services.registry}
    is_ready = any(models.values())
    body = {
        "status": "ready" if is_ready else "not_ready",
        "models": models,
        "breakers": request.app.state.services.executor.states(),
    }
    return Response(orjson.dumps(body), status_code=200 if is_ready else 503, media_type="application/json")
