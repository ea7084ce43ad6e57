from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.responses_wire import ResponseObject, ResponsesRequest
from switchyard.gateway.responses_stream import as_chat_request
from switchyard.proxy.exchange import serve_model_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.routes.plain import PlainRoute

router = APIRouter(route_class=PlainRoute)


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest), responses=answers(ResponseObject, stream=True))
async def create_response(request: Request) -> Response:
    """OpenAI's Responses API, stateless: answered as a chat completion by the same path, then
    written back as a Response object or its stream of events."""
    return await serve_model_request(request, ResponsesRequest, as_chat_request)
