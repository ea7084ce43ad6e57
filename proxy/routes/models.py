from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.protocol import ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    cards = [
        ModelCard(
            id=entry.name,
            tier=entry.tier,
            context_window=entry.context_window,
            ready=entry.backend.is_ready(),
        )
        for entry in request.app.state.registry
    ]
    return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")
