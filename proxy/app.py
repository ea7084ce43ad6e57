"""The application factory: nothing happens at import time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator

from fastapi import FastAPI

from billing.budgets import SpendTracker, start_of_utc_day
from billing.ledger import SQLiteLedger
from billing.teams import Team, TeamDirectory
from cascade.build import build_cascade, rung_specs
from classifier.model import DEFAULT_ARTIFACT, ArtifactError, ComplexityClassifier
from classifier.runtime import MicroBatcher
from evals.thresholds_file import ThresholdsError, read_thresholds
from proxy.errors import install_error_handlers
from proxy.middleware import RequestIdMiddleware
from proxy.registry import ModelRegistry, build_http_session, build_registry
from proxy.resilience import ResiliencePolicy, ResilientExecutor
from proxy.routes import ROUTERS
from proxy.routing import AutoRouter, resolve_thresholds
from proxy.saturation import SaturationGate
from proxy.settings import Settings, load_settings

logger = logging.getLogger("switchyard")


async def _watch_health(registry: ModelRegistry, interval_s: float) -> None:
    """Probe every backend now and then; log each change of verdict."""
    last: dict[str, str] = {}
    while True:
        verdicts = await asyncio.gather(*(entry.backend.health() for entry in registry))
        for entry, verdict in zip(registry, verdicts, strict=True):
            summary = "ready" if verdict.is_ready else f"not ready: {verdict.detail}"
            if last.get(entry.name, "ready" if verdict.is_ready else "") != summary:
                log = logger.info if verdict.is_ready else logger.warning
                log("model %s is %s", entry.name, summary)
            last[entry.name] = summary
        await asyncio.sleep(interval_s)


def _prices(settings: Settings, registry: ModelRegistry) -> dict[str, tuple[float, float]]:
    """USD per million (input, output) tokens per model: the config's, else the backend's own."""
    prices = {}
    for model in settings.models:
        if model.price is not None:
            prices[model.name] = (model.price.input_usd_per_mtok, model.price.output_usd_per_mtok)
            continue
        own = getattr(registry.get(model.name).backend, "price_usd_per_mtok", None)
        if own is not None and (value := own()) is not None:
            prices[model.name] = value
    return prices


def _build_auto_router(
    settings: Settings, registry: ModelRegistry, thresholds: dict, prices: dict[str, tuple[float, float]]
) -> AutoRouter:
    """The classifier loads on its worker thread at the first batch; a warm-up batch starts that now."""
    auto = settings.routing.auto
    artifact = auto.classifier_artifact or DEFAULT_ARTIFACT
    loaded: list[ComplexityClassifier] = []

    def score_batch(texts: list[str]):
        if not loaded:
            loaded.append(ComplexityClassifier.load(artifact, num_threads=auto.threads))
        return loaded[0].score(texts)

    batcher = MicroBatcher(
        score_batch, max_batch=auto.max_batch, max_wait_ms=auto.max_wait_ms, cache_size=auto.cache_size
    )
    router = AutoRouter(
        registry,
        auto.tiers,
        thresholds,
        batcher,
        default_tier=auto.default_tier or auto.tiers[0],
        deadline_ms=auto.deadline_ms,
        prices=prices,
    )
    if auto.warm_up:
        warm_up = asyncio.get_running_loop().create_task(batcher.score("warm-up", deadline_s=600))
        warm_up.add_done_callback(lambda task: task.cancelled() or task.exception())
    return router


def _build_teams(settings: Settings) -> TeamDirectory:
    return TeamDirectory(
        (
            Team(name, frozenset(team.models) if team.models is not None else None, team.budget_usd_per_day),
            [key.get_secret_value() for key in team.api_keys],
        )
        for name, team in settings.teams.items()
    )


async def _spend_so_far_today(ledger: SQLiteLedger | None, teams: TeamDirectory) -> SpendTracker:
    """Budgets survive a restart: today's spend is read back from the ledger."""
    spend = SpendTracker()
    if ledger is not None and teams.is_enabled:
        since = start_of_utc_day(time.time())
        for team, cost_usd in (await ledger.spend_since(since)).items():
            spend.add(team, cost_usd, since)
    return spend


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app. A thresholds file is read here, so a bad one stops the start (ThresholdsError)."""
    settings = settings if settings is not None else load_settings(None)
    thresholds_file = settings.routing.thresholds_file
    thresholds = read_thresholds(thresholds_file) if thresholds_file is not None else None
    auto = settings.routing.auto
    try:
        cascade_specs = rung_specs(settings.cascade, thresholds)
    except ValueError as exc:
        raise ThresholdsError(str(exc)) from exc
    if auto.tiers:
        try:
            auto_thresholds = resolve_thresholds(auto.tiers, auto.thresholds, thresholds)
            ComplexityClassifier.read_metadata(auto.classifier_artifact or DEFAULT_ARTIFACT)
        except (ValueError, ArtifactError) as exc:
            raise ThresholdsError(f"routing.auto: {exc}") from exc

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
        app.state.prices = prices = _prices(settings, registry)
        app.state.auto_router = _build_auto_router(settings, registry, auto_thresholds, prices) if auto.tiers else None
        app.state.ledger = SQLiteLedger(settings.billing.ledger_path) if settings.billing.ledger_path else None
        if app.state.ledger is not None:
            await app.state.ledger.start()
        app.state.teams = _build_teams(settings)
        app.state.spend = await _spend_so_far_today(app.state.ledger, app.state.teams)
        app.state.attempt_counts = Counter()
        app.state.saturation = SaturationGate(
            registry,
            {m.name: m.degrade_to for m in settings.models if m.degrade_to},
            wait_s=settings.resilience.saturation_wait_s,
            max_waiting=settings.resilience.saturation_max_waiting,
        )
        app.state.executor = ResilientExecutor(
            registry,
            {m.name: m.fallbacks for m in settings.models if m.fallbacks},
            ResiliencePolicy(**settings.resilience.model_dump()),
        )
        app.state.cascade = (
            build_cascade(settings.cascade, cascade_specs, registry, app.state.executor) if cascade_specs else None
        )
        # Backends that load something (the embedded engine's model) do it in the background:
        # the server answers at once, and /health/ready says when each model is ready.
        starting = [asyncio.create_task(e.backend.start()) for e in registry if hasattr(e.backend, "start")]
        watcher = asyncio.create_task(_watch_health(registry, settings.upstream.health_interval_s))
        try:
            yield
        finally:
            for task in (watcher, *starting):
                task.cancel()
            for task in (watcher, *starting):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for entry in registry:
                await entry.backend.aclose()
            if app.state.auto_router is not None and app.state.auto_router.scorer is not None:
                app.state.auto_router.scorer.close()
            if app.state.ledger is not None:
                await app.state.ledger.aclose()
            await session.close()

    app = FastAPI(title="Switchyard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(RequestIdMiddleware)
    return app
