from fastapi import APIRouter, Request
from fastapi.responses import Response

from proxy.body import read_request
from proxy.protocol import CompletionRequest
from proxy.relay import relay

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    return await relay(request, await read_request(request, CompletionRequest))
