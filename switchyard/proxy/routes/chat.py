from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.chat_wire import ChatCompletion, ChatCompletionRequest
from switchyard.proxy.exchange import serve_model_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.routes.plain import PlainRoute

router = APIRouter(route_class=PlainRoute)


@router.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=answers(ChatCompletion, stream=True),
)
async def create_chat_completion(request: Request) -> Response:
    return await serve_model_request(request, ChatCompletionRequest)
