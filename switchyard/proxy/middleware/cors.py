"""CORS for browser apps (`server.cors_origins`): Starlette's middleware, with OpenAI-shaped refusals.

A preflight (OPTIONS with `Access-Control-Request-Method`) is answered here, before the key is
checked: browsers send it without one. Any request header is allowed (the `openai` SDK in a
browser adds its own `x-stainless-*` headers besides `Authorization`, `Content-Type` and
`x-switchyard-*`); keys travel in `Authorization`, never in cookies, so credentials stay off.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from switchyard.core.errors import InvalidRequest, error_body

# What a browser script may read of an answer besides the CORS-safelisted headers.
EXPOSED_HEADERS = (
    "x-request-id",
    "x-client-request-id",
    "x-switchyard-model",
    "x-switchyard-backend",
    "x-switchyard-route",
    "x-switchyard-score",
    "x-switchyard-cascade",
    "x-switchyard-degraded",
    "x-switchyard-cost-usd",
    "x-switchyard-upstream-model",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "retry-after",
)


class OpenAICORSMiddleware(CORSMiddleware):
    """Starlette's CORS; a refused preflight (its origin, method or a header not allowed) is a 400 in
    OpenAI's shape instead of Starlette's plain text."""

    def __init__(self, app: ASGIApp, origins: Sequence[str]) -> None:
        super().__init__(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["*"],
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )

    def preflight_response(self, request_headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        refusal = InvalidRequest(
            f"CORS preflight refused: {bytes(response.body).decode()} (server.cors_origins lists the origins allowed).",
            code="cors_refused",
        )
        headers = {name: value for name, value in response.headers.items() if name.startswith("access-control-")}
        return Response(error_body(refusal), status_code=400, headers=headers, media_type="application/json")
