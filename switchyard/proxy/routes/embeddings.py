from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.core.embeddings_wire import EmbeddingList, EmbeddingRequest
from switchyard.proxy.exchange import serve_model_request
from switchyard.proxy.openapi import answers, json_body
from switchyard.proxy.routes.plain import PlainRoute

router = APIRouter(route_class=PlainRoute)


@router.post("/v1/embeddings", openapi_extra=json_body(EmbeddingRequest), responses=answers(EmbeddingList))
async def create_embeddings(request: Request) -> Response:
    """Embeddings from a model of kind `embedding`: metered, budgeted and limited like a completion."""
    return await serve_model_request(request, EmbeddingRequest)
