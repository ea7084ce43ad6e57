"""The application factory: nothing happens at import time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from fastapi import FastAPI

from switchyard.backends.base import Backend
from switchyard.backends.defaults import load_settings
from switchyard.batch.runner import open_batch_tier, start_batch_worker
from switchyard.core.settings import Settings
from switchyard.core.tracing import SpanExporter, build_tracing
from switchyard.gateway.reload import reload_on_sighup
from switchyard.gateway.services import ScoreBatch, build_services, check_startup
from switchyard.learning.shadow import start_shadow
from switchyard.proxy.error_handlers import install_error_handlers
from switchyard.proxy.middleware.cors import OpenAICORSMiddleware
from switchyard.proxy.middleware.request_ids import InFlight, RequestIdMiddleware
from switchyard.proxy.middleware.tracing import RequestTracingMiddleware
from switchyard.proxy.middleware.trailing_slash import TrailingSlashMiddleware
from switchyard.proxy.openapi import install_openapi
from switchyard.proxy.routes import ROUTERS
from switchyard.proxy.routes.plain import PlainRoutes, plain_endpoints

logger = logging.getLogger("switchyard")

DRAIN_TIMEOUT_S = 10.0  # at shutdown, how long requests still running may take to finish


def create_app(
    settings: Settings | None = None,
    *,
    backends: Mapping[str, Backend] | None = None,
    score_batch: ScoreBatch | None = None,
    span_exporter: SpanExporter | None = None,
    private_valkey_url: str | None = None,
    reload_signal: bool = False,
    reload_parent_pid: int | None = None,
) -> FastAPI:
    """Build the app. A thresholds file is read here, so a bad one stops the start (ThresholdsError).

    `backends` and `score_batch` replace what the settings would build (see `build_services`);
    `span_exporter` receives the request spans in place of `tracing.otlp_endpoint` (and turns
    tracing on). `private_valkey_url` is the private Valkey `switchyard serve` started for the batch
    queue when `billing.redis_url` is left out (budgets and rate limits stay in this process).
    `reload_signal`: SIGHUP reloads the routing files (`switchyard serve`); `reload_parent_pid`:
    this is one of `serve --workers N`, whose parent passes SIGHUP to every worker, so that
    `POST /admin/reload` reaches them all.
    """
    settings = settings if settings is not None else load_settings(None)
    check = check_startup(settings)
    in_flight = InFlight()
    tracing = build_tracing(settings.tracing, span_exporter)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (
            build_services(settings, check=check, backends=backends, score_batch=score_batch) as services,
            open_batch_tier(services, private_valkey_url) as batch,
            contextlib.AsyncExitStack() as stack,
        ):
            app.state.services, app.state.batch = services, batch
            if reload_signal:
                stack.enter_context(reload_on_sighup(services))
            # the batch tier's lines run with what this process's interactive requests leave
            batch_worker = (
                start_batch_worker(services, batch, lambda: len(in_flight.tasks))
                if batch is not None and settings.batch.run_in_proxy
                else None
            )
            # shadow jobs, like batch lines, run with what interactive requests leave
            app.state.shadow, shadow_tasks = await start_shadow(services, lambda: len(in_flight.tasks))
            try:
                yield
            finally:
                # The server has stopped accepting; requests still running (or being cancelled)
                # meter themselves as they end, so let them end before the ledger's last flush
                # (the batch worker lets its running lines finish too, bounded).
                await asyncio.gather(
                    in_flight.drain(DRAIN_TIMEOUT_S), batch_worker.aclose() if batch_worker else asyncio.sleep(0)
                )
                for task in shadow_tasks:  # a shadow job cut short is not run again: it is a sample
                    await task.aclose()
                if tracing is not None:
                    await asyncio.to_thread(tracing.shutdown)  # sends the spans still batched (blocking I/O)

    app = FastAPI(title="Switchyard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.in_flight = in_flight
    app.state.shadow = None  # switchyard.learning.shadow.Shadow, once started (shadow.rate > 0)
    app.state.settings = settings
    app.state.reload_parent_pid = reload_parent_pid
    install_error_handlers(app)
    install_openapi(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(PlainRoutes, endpoints=plain_endpoints(ROUTERS), fastapi=app)
    app.add_middleware(TrailingSlashMiddleware)
    if tracing is not None:
        app.add_middleware(RequestTracingMiddleware, tracing=tracing)
    app.add_middleware(RequestIdMiddleware, in_flight=in_flight)
    if settings.server.cors_origins:  # outermost: every answer carries CORS headers, its last-resort 500 too
        app.add_middleware(OpenAICORSMiddleware, origins=settings.server.cors_origins)
    return app
