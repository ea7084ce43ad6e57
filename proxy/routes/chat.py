from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.body import read_request
from proxy.protocol import ChatCompletionRequest
from proxy.relay import relay

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request) -> Response:
    return await relay(request, await read_request(request, ChatCompletionRequest))
