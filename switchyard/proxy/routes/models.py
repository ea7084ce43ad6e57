from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.chat_wire import ModelCard, ModelList
from switchyard.gateway.model_cards import model_card, model_cards
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import answers

router = APIRouter(route_class=LoggedRoute)


@router.get("/v1/models", responses=answers(ModelList))
async def list_models(request: Request) -> Response:
    """The models the caller may use (all of them when no teams are configured), then `auto` and
    `cascade` when configured."""
    principal = authenticate(services_of(request), request)
    team = principal.team if principal is not None else None
    cards = model_cards(services_of(request), team)
    return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")


@router.get("/v1/models/{model:path}", responses=answers(ModelCard))
async def retrieve_model(request: Request, model: str) -> Response:
    """One model's card; 404 `model_not_found` for a model that does not exist or the caller may not use."""
    principal = authenticate(services_of(request), request)
    team = principal.team if principal is not None else None
    card = model_card(services_of(request), team, model)
    return Response(card.model_dump_json(), media_type="application/json")
