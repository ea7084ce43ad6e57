from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.tokenize_wire import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from switchyard.gateway.tokenizing import count_tokens, read_tokens
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate
from switchyard.proxy.body import read_request
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import answers, json_body

router = APIRouter(route_class=LoggedRoute)


@router.post("/v1/tokenize", openapi_extra=json_body(TokenizeRequest), responses=answers(TokenizeResponse))
async def tokenize(request: Request) -> Response:
    """The tokens the answering model would be given for `messages` (its chat template applied) or
    `prompt`, and what they would cost; see docs/tokenize.md."""
    services = services_of(request)
    principal = authenticate(services, request)
    body = await read_request(request, TokenizeRequest, services.settings.server)
    answer = await count_tokens(services, principal, body, request.headers.get("x-switchyard-quality"))
    return Response(answer.to_json(), media_type="application/json")


@router.post("/v1/detokenize", openapi_extra=json_body(DetokenizeRequest), responses=answers(DetokenizeResponse))
async def detokenize(request: Request) -> Response:
    """The text of a model's token ids."""
    services = services_of(request)
    principal = authenticate(services, request)
    body = await read_request(request, DetokenizeRequest, services.settings.server)
    answer = await read_tokens(services, principal, body)
    return Response(answer.model_dump_json(), media_type="application/json")
