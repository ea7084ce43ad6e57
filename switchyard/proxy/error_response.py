"""An error as the HTTP response a client gets: its OpenAI-shaped body, status and headers."""

from __future__ import annotations

from starlette.responses import Response

from switchyard.core.errors import SwitchyardError, error_body


def error_response(exc: SwitchyardError) -> Response:
    return Response(error_body(exc), status_code=exc.status_code, headers=exc.headers(), media_type="application/json")
