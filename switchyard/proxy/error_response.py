"""An error as the HTTP response a client gets: its body, status and headers, in the shape of the
API it came in by (OpenAI's, or Anthropic's under `/v1/messages`)."""

from __future__ import annotations

from starlette.responses import Response

from switchyard.core.errors import SwitchyardError
from switchyard.gateway.answer_shape import PASS_THROUGH, AnswerShape
from switchyard.gateway.messages_stream import MESSAGES_ERRORS

MESSAGES_PATH = "/v1/messages"


def is_messages_path(path: str) -> bool:
    """Whether `path` is Anthropic's Messages API (its errors in Anthropic's shape)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def errors_of(path: str) -> AnswerShape:
    """How the API at `path` writes its errors."""
    if is_messages_path(path):
        return MESSAGES_ERRORS
    return PASS_THROUGH


def error_response(exc: SwitchyardError, shape: AnswerShape = PASS_THROUGH) -> Response:
    return Response(
        shape.refusal(exc), status_code=shape.refusal_status(exc), headers=exc.headers(), media_type="application/json"
    )
