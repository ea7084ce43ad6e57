from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.messages_wire import CountTokensRequest, MessageObject, MessagesRequest, TokenCount
from switchyard.gateway.messages import count_input_tokens
from switchyard.gateway.messages_stream import as_chat_request
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import authenticate
from switchyard.proxy.body import read_request
from switchyard.proxy.exchange import LoggedRoute, serve_model_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.routes.plain import PlainRoute

router = APIRouter(route_class=PlainRoute)
counting = APIRouter(route_class=LoggedRoute)

TOKEN_COUNT_HEADER = "x-switchyard-token-count"


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest), responses=answers(MessageObject, stream=True))
async def create_message(request: Request) -> Response:
    """Anthropic's Messages API: answered as a chat completion by the same path, then written back
    as a Message or its stream of events; errors in Anthropic's shape."""
    return await serve_model_request(request, MessagesRequest, as_chat_request)


@counting.post("/v1/messages/count_tokens", openapi_extra=json_body(CountTokensRequest), responses=answers(TokenCount))
async def count_message_tokens(request: Request) -> Response:
    """The input tokens of a Messages request, counted as `/v1/tokenize` counts them; a count made
    with a stand-in tokenizer says so in `x-switchyard-token-count: approximate`."""
    services = services_of(request)
    principal = authenticate(services, request)
    body = await read_request(request, CountTokensRequest, services.settings.server)
    counted = await count_input_tokens(services, principal, body, request.headers.get("x-switchyard-quality"))
    headers = {TOKEN_COUNT_HEADER: "approximate" if counted.approximate else "exact"}
    return Response(
        TokenCount(input_tokens=counted.count).model_dump_json(), headers=headers, media_type="application/json"
    )
