from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.errors import SwitchyardError
from switchyard.core.responses_wire import ResponseObject, ResponsesRequest
from switchyard.proxy.access import authenticate
from switchyard.proxy.body import read_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.relay import relay
from switchyard.proxy.responses import draft_for, responses_param, to_chat_request
from switchyard.proxy.responses_stream import ResponsesShape

router = APIRouter()


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest), responses=answers(ResponseObject, stream=True))
async def create_response(request: Request) -> Response:
    """OpenAI's Responses API, stateless: answered as a chat completion by the same path, then
    written back as a Response object or its stream of events."""
    principal = authenticate(request)  # before the body: a caller without a key learns that first
    asked = await read_request(request, ResponsesRequest)
    chat = to_chat_request(asked, request.app.state.services.settings.server.body_limits())
    try:
        return await relay(request, principal, chat, ResponsesShape(draft_for(asked)))
    except SwitchyardError as exc:  # refused before the first byte: name what the client sent
        exc.param = responses_param(exc.param)
        raise
