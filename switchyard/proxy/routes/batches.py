"""`/v1/batches`: create (the input file is checked by a worker: `validating`), list, retrieve, cancel."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from redis.exceptions import RedisError

from switchyard.batch.batches_wire import CreateBatch, batch_object, list_object
from switchyard.batch.jobs import Batch
from switchyard.batch.line_queue import Work
from switchyard.batch.lines import LineError
from switchyard.core.errors import Conflict, InvalidRequest, NotFound, ServiceUnavailable
from switchyard.gateway.parsing import invalid_request
from switchyard.proxy.app_state import services_of
from switchyard.proxy.body import read_body
from switchyard.proxy.exchange import LoggedRoute
from switchyard.proxy.openapi import json_body, query
from switchyard.proxy.routes.batch_support import batch_tier_of, caller_of, creator_of, page_limit

router = APIRouter(route_class=LoggedRoute)

LIST_QUERY = query(("limit", {"type": "integer", "minimum": 1, "maximum": 100}), ("after", {"type": "string"}))


def _json(payload: object) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


async def _visible(request: Request, batch_id: str) -> Batch:
    caller = caller_of(request)
    batch = await batch_tier_of(request).batches.get(batch_id)
    if batch is None or not caller.may_see(batch.team):
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return batch


@router.post("/v1/batches", openapi_extra=json_body(CreateBatch))
async def create_batch(request: Request) -> Response:
    tier = batch_tier_of(request)
    caller = creator_of(request)
    server = services_of(request).settings.server
    body = await read_body(request, server.max_body_bytes, server.body_timeout_s)
    try:
        asked = CreateBatch.model_validate_json(body)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            raise InvalidRequest("The request body is not valid JSON.", code="invalid_json") from None
        raise invalid_request(exc) from None
    stored = await tier.files.get(asked.input_file_id)
    if stored is None or stored.team != caller.team:
        raise NotFound(f"No such File object: {asked.input_file_id}", param="input_file_id")
    if stored.purpose != "batch":
        raise InvalidRequest(
            f"File {stored.id} was not uploaded with purpose 'batch' (it is '{stored.purpose}').",
            param="input_file_id",
        )
    batch = await tier.batches.create(
        team=caller.team,
        key_id=caller.key_id,
        endpoint=asked.endpoint,
        input_file_id=stored.id,
        completion_window=asked.completion_window,
        window_s=tier.settings.window_s,
        metadata=asked.metadata,
    )
    try:
        await tier.queue.add([Work("", "validate", batch.id)])
    except (RedisError, OSError) as exc:  # never queued: failed now rather than validating forever
        error = LineError("queue_unavailable", "The batch queue (Valkey) did not answer; create the batch again.")
        await tier.batches.fail(batch.id, [error], 1)
        raise ServiceUnavailable("The batch queue did not answer; create the batch again shortly.") from exc
    return _json(batch_object(batch))


@router.get("/v1/batches", openapi_extra=LIST_QUERY)
async def list_batches(request: Request) -> Response:
    caller = caller_of(request)
    limit = page_limit(request, 20, 100)
    batches = await batch_tier_of(request).batches.page(
        None if caller.sees_all else caller.team, after=request.query_params.get("after"), limit=limit + 1
    )
    return _json(list_object([batch_object(b) for b in batches[:limit]], len(batches) > limit))


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(request: Request, batch_id: str) -> Response:
    return _json(batch_object(await _visible(request, batch_id)))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> Response:
    """The lines not run yet will not run; those running finish (and are paid for)."""
    batch = await _visible(request, batch_id)
    tier = batch_tier_of(request)
    if not await tier.batches.cancel(batch.id):
        batch = await tier.batches.get(batch.id) or batch
        if batch.status not in ("cancelling", "cancelled"):
            if batch.ending is not None:
                raise Conflict(f"Batch {batch.id} is ending ({batch.ending}); it can no longer be cancelled.")
            raise Conflict(
                f"Batch {batch.id} is {batch.status}; only a validating or in-progress batch can be cancelled."
            )
        return _json(batch_object(batch))
    cancelled = await tier.batches.get(batch.id)
    assert cancelled is not None
    if cancelled.status == "cancelling" and cancelled.in_progress_at is not None:
        await asyncio.shield(tier.finisher.sweep(cancelled, 0.0))  # a client leaving does not stop it midway
    return _json(batch_object(await tier.batches.get(batch.id) or cancelled))
