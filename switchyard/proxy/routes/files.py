"""`/v1/files`: upload (multipart, streamed to storage), list, retrieve, download, delete."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from switchyard.batch.batches_wire import FILE_PURPOSES, file_object, list_object
from switchyard.batch.files import FileTooLarge, StoredFile
from switchyard.core.errors import InvalidRequest, NotFound, RequestTooLarge
from switchyard.proxy.app_state import services_of
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import query
from switchyard.proxy.routes.batch_support import Caller, batch_tier_of, caller_of, creator_of, page_limit
from switchyard.proxy.uploads import Upload

router = APIRouter(route_class=LoggedRoute)

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": list(FILE_PURPOSES)},
                    },
                }
            }
        },
    }
}
LIST_QUERY = query(
    ("purpose", {"type": "string"}),
    ("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
    ("after", {"type": "string"}),
)
MULTIPART_SLACK = 64 * 1024  # the form's own bytes around the file


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


async def _visible(request: Request, file_id: str) -> tuple[Caller, StoredFile]:
    caller = caller_of(request)
    stored = await batch_tier_of(request).files.get(file_id)
    if stored is None or not caller.may_see(stored.team):
        raise NotFound(f"No such File object: {file_id}", param="file_id")
    return caller, stored


@router.post("/v1/files", openapi_extra=UPLOAD_BODY)
async def upload_file(request: Request) -> Response:
    tier = batch_tier_of(request)
    caller = creator_of(request)
    limit = tier.settings.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + MULTIPART_SLACK:
        raise RequestTooLarge(
            f"The upload is {declared} bytes; a file may have at most {limit} (batch.max_file_bytes)."
        )
    upload = Upload(request, idle_timeout_s=services_of(request).settings.server.body_timeout_s)
    try:
        stored = await tier.files.create(caller.team, "batch", "upload.jsonl", upload.file_chunks(), max_bytes=limit)
    except FileTooLarge:
        raise RequestTooLarge(f"The file is larger than {limit} bytes (batch.max_file_bytes).") from None
    purpose = upload.fields.get("purpose")
    problem = None
    if upload.filename is None:
        problem = InvalidRequest("The form has no 'file' part.", param="file", code="missing_required_parameter")
    elif purpose is None:
        problem = InvalidRequest("The form has no 'purpose' part.", param="purpose", code="missing_required_parameter")
    elif purpose not in FILE_PURPOSES:
        problem = InvalidRequest(
            f"purpose must be one of {', '.join(FILE_PURPOSES)}, not {purpose!r}.", param="purpose"
        )
    if problem is not None:
        await tier.files.delete(stored.id)
        raise problem
    await tier.files.rename(stored.id, upload.filename or "upload.jsonl")
    stored = await tier.files.get(stored.id) or stored
    return _json(file_object(stored))


@router.get("/v1/files", openapi_extra=LIST_QUERY)
async def list_files(request: Request) -> Response:
    caller = caller_of(request)
    limit = page_limit(request, 10000, 10000)
    params = request.query_params
    files = await batch_tier_of(request).files.page(
        None if caller.sees_all else caller.team,
        purpose=params.get("purpose"),
        after=params.get("after"),
        limit=limit + 1,
    )
    data = [file_object(f) for f in files[:limit]]
    return _json(list_object(data, len(files) > limit))


@router.get("/v1/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> Response:
    _, stored = await _visible(request, file_id)
    return _json(file_object(stored))


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> Response:
    _, stored = await _visible(request, file_id)
    return StreamingResponse(
        batch_tier_of(request).files.read(stored.id),
        media_type="application/octet-stream",
        headers={
            "content-length": str(stored.bytes),
            "content-disposition": f'attachment; filename="{stored.id}.jsonl"',
        },
    )


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> Response:
    _, stored = await _visible(request, file_id)
    await batch_tier_of(request).files.delete(stored.id)
    return _json({"id": stored.id, "object": "file", "deleted": True})
