from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.protocol import ModelCard, ModelList
from switchyard.proxy.access import authenticate
from switchyard.proxy.openapi import answers

router = APIRouter()


@router.get("/v1/models", responses=answers(ModelList))
async def list_models(request: Request) -> Response:
    """The models the caller may use (all of them when no teams are configured)."""
    principal = authenticate(request)
    team = principal.team if principal is not None else None
    cards = [
        ModelCard(
            id=entry.name,
            tier=entry.tier,
            context_window=entry.context_window,
            ready=entry.backend.is_ready(),
        )
        for entry in request.app.state.services.registry
        if team is None or team.may_use(entry.name)
    ]
    return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")
