from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.protocol import ChatCompletion, ChatCompletionRequest
from switchyard.proxy.access import authenticate
from switchyard.proxy.body import read_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.relay import relay

router = APIRouter()


@router.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=answers(ChatCompletion, stream=True),
)
async def create_chat_completion(request: Request) -> Response:
    principal = authenticate(request)  # before the body: a caller without a key learns that first
    return await relay(request, principal, await read_request(request, ChatCompletionRequest))
