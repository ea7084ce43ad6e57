"""The composition root: settings in, every running service out, and shut down in order.

`build_services()` is the one place that builds the HTTP session, the model registry (backends
started), the resilient executor, prices, the database and its ledger writer, the directory of
teams and keys, budgets and rate limits (in this process or in Valkey), the saturation gate, the
auto router (with its classifier) and the cascade. The app's lifespan, `switchyard eval collect`
and the benchmarks all use it. What can be checked before anything starts (the thresholds file,
the cascade section, the classifier artifact) is checked by `check_startup()`, which `create_app`
calls at once so that a bad file stops the start with a message.

Shutdown order: in-flight requests are drained first (by the caller, bounded), then reservations
are settled, the ledger is flushed (or spilled), the database closed, then background tasks,
backends and the HTTP session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from switchyard.backends.base import Backend
from switchyard.backends.registry import ModelRegistry, build_http_session, build_registry
from switchyard.backends.resilience import ResiliencePolicy, ResilientExecutor
from switchyard.billing.budgets import Budgets, budget_scopes
from switchyard.billing.directory import Directory
from switchyard.billing.ledger import LedgerWriter
from switchyard.billing.limits import BudgetScope, LocalLimiter, open_limiter
from switchyard.billing.store import Database, open_database
from switchyard.billing.teams import Principal, Team, yaml_keys
from switchyard.cascade.build import RungSpec, build_cascade, rung_specs
from switchyard.cascade.runtime import Cascade
from switchyard.classifier.by_value import ValueRule
from switchyard.classifier.model import ArtifactError, ComplexityClassifier, default_artifact
from switchyard.classifier.runtime import MicroBatcher
from switchyard.core.drift import DriftMonitor
from switchyard.core.metrics import Metrics, multiprocess_dir
from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.core.supervision import SupervisedTask
from switchyard.core.thresholds import ThresholdsError, ThresholdsFile, read_thresholds
from switchyard.gateway.auto_router import AutoRouter, resolve_thresholds, resolve_value_rule
from switchyard.gateway.gauges import LiveGauges, SharedGauges
from switchyard.gateway.live_streams import LiveStreams
from switchyard.gateway.saturation import SaturationGate
from switchyard.gateway.tiers import TierSlots

logger = logging.getLogger("switchyard")

ScoreBatch = Callable[[list[str]], np.ndarray]
# The loaded classifier's embedding of texts (blocking: run it off the event loop); None until loaded.
EmbedTexts = Callable[[list[str]], np.ndarray | None]


@dataclass(frozen=True, slots=True)
class StartupCheck:
    """What the settings resolve to before anything runs."""

    thresholds: ThresholdsFile | None
    cascade_specs: list[RungSpec]
    auto_thresholds: dict[str, list[float]] | None
    auto_value: ValueRule | None = None  # routing by value


def check_startup(settings: Settings) -> StartupCheck:
    """Read the thresholds file and check the cascade and auto sections (ThresholdsError if unusable)."""
    path = settings.routing.thresholds_file
    thresholds = read_thresholds(path) if path is not None else None
    try:
        specs = rung_specs(settings.cascade, thresholds)
    except ValueError as exc:
        raise ThresholdsError(str(exc)) from exc
    auto = settings.routing.auto
    auto_thresholds = value = None
    if auto.tiers:
        tolerance = {str(mode): points for mode, points in (auto.tolerance or {}).items()}
        try:
            value = resolve_value_rule(auto.tiers, auto.quality_models, tolerance, thresholds)
            artifact = auto.classifier_artifact or default_artifact(by_value=value is not None)
            if value is None:
                auto_thresholds = resolve_thresholds(auto.tiers, auto.thresholds, thresholds)
                ComplexityClassifier.read_metadata(artifact)
                if path is not None and thresholds is not None and thresholds.routing is not None:
                    _check_thresholds_fit(path, Path(artifact))
            else:  # the score's thresholds are not used; the artifact must know every tier's model
                auto_thresholds = {}
                ComplexityClassifier.check_quality_models(artifact, value.quality_models)
        except (ValueError, ArtifactError) as exc:
            raise ThresholdsError(f"routing.auto: {exc}") from exc
    return StartupCheck(thresholds, specs, auto_thresholds, value)


def _check_thresholds_fit(path: Path, artifact: Path) -> None:
    """A thresholds file inside an artifact's folder holds thresholds on that artifact's scores:
    on another artifact's scores, whose scale differs, they would route wrong without a sign."""
    folder = path.parent
    if (folder / "metadata.json").is_file() and folder.resolve() != artifact.resolve():
        raise ValueError(
            f"the thresholds file {path} was picked for the classifier in {folder}, but the classifier is "
            f"{artifact}: set routing.auto.classifier_artifact to {folder}, or use {artifact}/thresholds.yaml"
        )


@dataclass(slots=True)
class Services:
    settings: Settings
    thresholds: ThresholdsFile | None
    session: aiohttp.ClientSession
    registry: ModelRegistry
    prices: dict[str, Price]
    executor: ResilientExecutor
    database: Database | None
    ledger: LedgerWriter | None
    directory: Directory
    budgets: Budgets
    tier_slots: TierSlots
    attempt_counts: Counter
    saturation: SaturationGate
    auto_router: AutoRouter | None
    cascade: Cascade | None
    metrics: Metrics = field(default_factory=Metrics)
    drift: DriftMonitor | None = None  # the drift gauges' windows (core/drift.py)
    streams: LiveStreams = field(default_factory=LiveStreams)
    shared_gauges: SharedGauges | None = None  # one of several workers (proxy/metrics.py)
    background: list[SupervisedTask] = field(default_factory=list)
    embed_texts: EmbedTexts | None = None  # the auto router's classifier embedder (switchyard.learning)

    def background_tasks(self) -> list[SupervisedTask]:
        """Every supervised long-running task: ours and the backends' (readiness shows them)."""
        return [*self.background, *(task for entry in self.registry for task in entry.backend.background_tasks())]


@contextlib.asynccontextmanager
async def build_services(
    settings: Settings,
    *,
    check: StartupCheck | None = None,
    backends: Mapping[str, Backend] | None = None,
    score_batch: ScoreBatch | None = None,
    only_models: Sequence[str] | None = None,
) -> AsyncIterator[Services]:
    """Build and start everything; close it all, in order, on exit.

    `backends` replaces the backend built for a configured model of that name (tests hand in
    their own); `score_batch` replaces the classifier (texts -> scores in [0, 1]).
    `only_models` is an offline run (`eval collect`): just those models, each started before
    this returns, with no fallbacks, auto routing, cascade, ledger or teams. The batch tier is
    opened on these services by its users (`switchyard.batch.runner.open_batch_tier`).
    """
    check = check if check is not None else check_startup(settings)
    is_offline = only_models is not None
    async with contextlib.AsyncExitStack() as stack:
        session = build_http_session(settings.upstream)
        stack.push_async_callback(session.close)
        registry = build_registry(settings, session, backends=backends, only=only_models)
        stack.push_async_callback(_close_backends, registry)
        if not len(registry):
            logger.warning("no models are configured: pass --config FILE (see README)")
        prices = model_prices(settings, registry)
        executor = ResilientExecutor(
            registry,
            {} if is_offline else {m.name: m.fallbacks for m in settings.models if m.fallbacks},
            ResiliencePolicy(**settings.resilience.model_dump()),
        )
        metrics = Metrics()
        drift = None if is_offline else build_drift_monitor(settings, check)
        auto_router, embed_texts = None, None
        if not is_offline and check.auto_thresholds is not None:
            auto_router, embed_texts = _build_auto_router(
                settings, check, registry, prices, score_batch, metrics, drift
            )
            stack.callback(_close_router, auto_router)
        cascade = None
        if check.cascade_specs and not is_offline:
            cascade = build_cascade(settings.cascade, check.cascade_specs, registry, executor, metrics, drift)
        # closed in the reverse order: budgets settled, then the ledger flushed, then the database
        accounts = await stack.enter_async_context(_accounts(settings, is_offline))
        services = Services(
            settings=settings,
            thresholds=check.thresholds,
            session=session,
            registry=registry,
            prices=prices,
            executor=executor,
            database=accounts.database,
            ledger=accounts.ledger,
            directory=accounts.directory,
            budgets=accounts.budgets,
            tier_slots=TierSlots(settings.billing.priority_tiers),
            attempt_counts=Counter(),
            saturation=SaturationGate(
                registry,
                {m.name: m.degrade_to for m in settings.models if m.degrade_to},
                wait_s=settings.resilience.saturation_wait_s,
                max_waiting=settings.resilience.saturation_max_waiting,
            ),
            auto_router=auto_router,
            cascade=cascade,
            metrics=metrics,
            drift=drift,
            embed_texts=embed_texts,
        )
        if multiprocess_dir() is None or is_offline:
            metrics.registry.register(LiveGauges(services))
        else:
            services.shared_gauges = SharedGauges(services)
        await _start(services, stack, is_offline)
        yield services


@dataclass(frozen=True, slots=True)
class _Accounts:
    """What billing runs on: the database and its ledger writer, the teams and keys, the budgets."""

    database: Database | None
    ledger: LedgerWriter | None
    directory: Directory
    budgets: Budgets


@contextlib.asynccontextmanager
async def _accounts(settings: Settings, is_offline: bool) -> AsyncIterator[_Accounts]:
    """Opened in order, closed in reverse: the budgets settled to what the requests cost, then
    everything metered so far written (or spilled) before the database closes."""
    async with contextlib.AsyncExitStack() as stack:
        database: Database | None = None
        ledger: LedgerWriter | None = None
        url = settings.billing.resolved_database_url()
        if not is_offline and url is not None:
            database = await open_database(url)
            stack.push_async_callback(database.aclose)
            ledger = LedgerWriter(database, settings.billing.spill_path.expanduser())
            stack.push_async_callback(ledger.aclose)
            await ledger.start()
        directory = Directory()
        if not is_offline:
            directory = Directory(_yaml_teams(settings), database)
            stack.push_async_callback(directory.aclose)
            await directory.start()
        budgets = Budgets(
            open_limiter(settings.billing) if not is_offline else LocalLimiter(),
            reservation_ttl_s=settings.billing.reservation_ttl_s,
        )
        stack.push_async_callback(budgets.aclose)
        await budgets.limiter.start()
        if database is not None:
            await budgets.seed(database.spend_since, _all_budget_scopes(directory))
        yield _Accounts(database, ledger, directory, budgets)


async def _start(services: Services, stack: contextlib.AsyncExitStack, is_offline: bool) -> None:
    """Start the backends (offline: each before this returns; serving: in the background, so the
    server answers at once and /health/ready says when each model is ready) and the supervised
    background tasks, each stopped when the stack closes."""
    registry = services.registry
    if is_offline:
        for entry in registry:
            await entry.backend.start()
        return
    tasks = [asyncio.create_task(entry.backend.start(), name=f"start:{entry.name}") for entry in registry]
    for task in tasks:
        task.add_done_callback(_log_failed_start)
    stack.push_async_callback(_cancel_all, tasks)
    interval_s = services.settings.upstream.health_interval_s
    services.background.append(SupervisedTask("health-watcher", lambda: _watch_health(registry, interval_s)))
    if services.shared_gauges is not None:
        services.background.append(SupervisedTask("shared-gauges", services.shared_gauges.sync_forever))
    for supervised in services.background:
        supervised.start()
        stack.push_async_callback(supervised.aclose)


async def _cancel_all(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close_backends(registry: ModelRegistry) -> None:
    for entry in registry:
        await entry.backend.aclose()


def _close_router(router: AutoRouter) -> None:
    if router.scorer is not None:
        router.scorer.close()


def _log_failed_start(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s failed", task.get_name(), exc_info=task.exception())


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


def model_prices(settings: Settings, registry: ModelRegistry) -> dict[str, Price]:
    """Each model's price: the config's, else the backend's own (LiteLLM's price map)."""
    configured = {m.name: m.price.to_price() for m in settings.models if m.price is not None}
    for model in settings.models:  # a LoRA adapter: its own price, else its base model's
        for adapter in getattr(model, "adapters", ()):
            price = adapter.price or model.price
            if price is not None:
                configured[adapter.name] = price.to_price()
    prices = {}
    for entry in registry:
        price = configured.get(entry.name) or entry.backend.price()
        if price is not None:
            prices[entry.name] = price
    return prices


def _build_auto_router(
    settings: Settings,
    check: StartupCheck,
    registry: ModelRegistry,
    prices: dict[str, Price],
    score_batch: ScoreBatch | None,
    metrics: Metrics,
    drift: DriftMonitor | None,
) -> tuple[AutoRouter, EmbedTexts | None]:
    """The classifier loads on its worker thread at the first batch; a warm-up batch starts that now.
    Also returns its embedder (None: a `score_batch` replaces the classifier)."""
    auto, value = settings.routing.auto, check.auto_value
    assert check.auto_thresholds is not None
    embed_texts: EmbedTexts | None = None
    if score_batch is None:
        artifact = auto.classifier_artifact or default_artifact(by_value=value is not None)
        loaded: list[ComplexityClassifier] = []

        def score_batch(texts: list[str]) -> np.ndarray:
            if not loaded:
                loaded.append(ComplexityClassifier.load(artifact, num_threads=auto.threads))
            if value is not None:  # the score, then each tier's predicted quality
                return loaded[0].score_with_quality(texts, value.quality_models)
            return loaded[0].score(texts)

        def embed_texts(texts: list[str]) -> np.ndarray | None:
            return np.asarray(loaded[0].embedder.encode(texts), dtype=np.float32) if loaded else None

    batcher = MicroBatcher(
        score_batch, max_batch=auto.max_batch, max_wait_ms=auto.max_wait_ms, cache_size=auto.cache_size
    )
    router = AutoRouter(
        registry,
        auto.tiers,
        check.auto_thresholds,
        batcher,
        default_tier=auto.default_tier or auto.tiers[0],
        deadline_ms=auto.deadline_ms,
        prices=prices,
        metrics=metrics,
        read_system_prompt=auto.read_system_prompt,
        value=value,
        drift=drift,
    )
    if auto.warm_up:
        warm_up = asyncio.get_running_loop().create_task(batcher.score("warm-up", deadline_s=600))
        warm_up.add_done_callback(lambda task: task.cancelled() or task.exception())
    return router, embed_texts


def build_drift_monitor(settings: Settings, check: StartupCheck) -> DriftMonitor | None:
    """The drift windows of the loaded version (None: `drift.enabled` is off, or nothing is routed)."""
    has_classifier = check.auto_thresholds is not None
    judged = [spec.model for spec in check.cascade_specs[:-1]]  # the last rung is never judged
    if not settings.drift.enabled or not (has_classifier or judged):
        return None
    balanced = (check.auto_thresholds or {}).get("balanced") or []
    return DriftMonitor.of(
        check.thresholds,
        window=settings.drift.window,
        min_samples=settings.drift.min_samples,
        psi_alert=settings.drift.psi_alert,
        classifier_threshold=balanced[0] if balanced else None,
        judged_rungs=judged,
        has_classifier=has_classifier,
    )


def _yaml_teams(settings: Settings) -> list[tuple[Team, list]]:
    return [
        (
            Team(
                name,
                frozenset(team.models) if team.models is not None else None,
                team.budget_usd_per_day,
                team.budget_usd_per_month,
                team.rpm,
                team.tpm,
                team.priority,
                default_adapters=tuple(team.default_adapters),
            ),
            yaml_keys(name, [key.get_secret_value() for key in team.api_keys]),
        )
        for name, team in settings.teams.items()
    ]


def _all_budget_scopes(directory: Directory) -> list[BudgetScope]:
    """Every team's and key's budgets, to read back from the ledger at start."""
    scopes: dict[tuple[str, str], BudgetScope] = {}
    for key in directory.keys():
        team = directory.teams.get(key.team)
        if team is not None:
            for scope in budget_scopes(Principal(team, key)):
                scopes[(scope.name, scope.period)] = scope
    return list(scopes.values())
