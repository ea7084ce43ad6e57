"""A path with a trailing slash served as the path without it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

PATH_AS_SENT = "switchyard.path_as_sent"  # in the scope, when the trailing slash was taken off


class TrailingSlashMiddleware:
    """Serves `/v1/chat/completions/` as `/v1/chat/completions` (instead of a 307 redirect, which
    SDKs do not follow with a POST body)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            stripped = path.rstrip("/") or "/"
            scope = {**scope, "path": stripped, "raw_path": stripped.encode(), PATH_AS_SENT: path}
        await self.app(scope, receive, send)
