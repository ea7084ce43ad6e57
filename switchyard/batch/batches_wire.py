"""OpenAI's shapes: the file object, the batch object, and a line of an output or error file."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from switchyard.batch.files import StoredFile
from switchyard.batch.jobs import Batch, Result

FILE_PURPOSES = ("batch",)  # what may be uploaded; a batch writes "batch_output"
MAX_METADATA_PAIRS = 16


class CreateBatch(BaseModel):
    """`POST /v1/batches`'s body."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=200)
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_PAIRS)


def _seconds(at: float | None) -> int | None:
    return int(at) if at is not None else None


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {
        "id": stored.id,
        "object": "file",
        "bytes": stored.bytes,
        "created_at": int(stored.created_at),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": stored.status,
        "status_details": None,
        "expires_at": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": _seconds(batch.in_progress_at),
        "expires_at": int(batch.expires_at),
        "finalizing_at": _seconds(batch.finalizing_at),
        "completed_at": _seconds(batch.completed_at),
        "failed_at": _seconds(batch.failed_at),
        "expired_at": _seconds(batch.expired_at),
        "cancelling_at": _seconds(batch.cancelling_at),
        "cancelled_at": _seconds(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "metadata": batch.metadata,
    }


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def is_answer(result: Result) -> bool:
    """An output file's line (else the error file's)."""
    return result.status_code is not None and 200 <= result.status_code < 300


def result_line(result: Result) -> bytes:
    """`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` and a newline;
    a line that never ran has no response and says why in `error`."""
    head = b'{"id":' + orjson.dumps(result.request_id) + b',"custom_id":' + orjson.dumps(result.custom_id)
    if result.status_code is None:
        error = {"code": result.error_code, "message": result.error_message}
        return head + b',"response":null,"error":' + orjson.dumps(error) + b"}\n"
    response = (
        b'{"status_code":'
        + str(int(result.status_code)).encode()
        + b',"request_id":'
        + orjson.dumps(result.request_id)
        + b',"body":'
        + (result.body.encode() if result.body is not None else b"null")
        + b"}"
    )
    return head + b',"response":' + response + b',"error":null}\n'
