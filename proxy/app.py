"""The application factory: nothing happens at import time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from evals.thresholds_file import read_thresholds
from proxy.errors import install_error_handlers
from proxy.middleware import RequestIdMiddleware
from proxy.registry import ModelRegistry, build_http_session, build_registry
from proxy.routes import ROUTERS
from proxy.settings import Settings, load_settings

logger = logging.getLogger("switchyard")


async def _watch_health(registry: ModelRegistry, interval_s: float) -> None:
    while True:
        verdicts = await asyncio.gather(*(entry.backend.health() for entry in registry))
        for entry, verdict in zip(registry, verdicts, strict=True):
            if not verdict.is_ready:
                logger.warning("model %s is not ready: %s", entry.name, verdict.detail)
        await asyncio.sleep(interval_s)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. A thresholds file is read here, so a bad one stops the start (ThresholdsError)."""
    settings = settings if settings is not None else load_settings(None)
    thresholds_file = settings.routing.thresholds_file
    thresholds = read_thresholds(thresholds_file) if thresholds_file is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        session = build_http_session(settings.upstream)
        registry = build_registry(settings, session)
        app.state.settings = settings
        app.state.thresholds = thresholds
        app.state.http_session = session
        app.state.registry = registry
        if not len(registry):
            logger.warning("no models are configured: pass --config FILE (see README)")
        watcher = asyncio.create_task(_watch_health(registry, settings.upstream.health_interval_s))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            for entry in registry:
                await entry.backend.aclose()
            await session.close()

    app = FastAPI(title="Switchyard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(RequestIdMiddleware)
    return app
