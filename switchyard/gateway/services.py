"""The composition root: settings in, every running service out, and shut down in order.

`build_services()` is the one place that builds the HTTP session, the model registry (backends
started), the resilient executor, prices, the database and its ledger writer, the directory of
teams and keys, budgets and rate limits (in this process or in Valkey), the saturation gate, the
routing versions (`gateway/routings.py`: the auto router with its classifier, and the cascade;
a reload swaps them, `gateway/reload.py`). The app's lifespan, `switchyard eval collect`
and the benchmarks all use it. What can be checked before anything starts (the thresholds file,
the cascade section, the classifier artifact) is checked by `check_startup()` (gateway/routings.py), which `create_app`
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
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from switchyard.backends.base import Backend
from switchyard.backends.registry import ModelRegistry, build_http_session, build_registry
from switchyard.backends.resilience import ResiliencePolicy, ResilientExecutor
from switchyard.billing.budgets import Budgets, budget_scopes
from switchyard.billing.directory import Directory
from switchyard.billing.ledger import LedgerWriter
from switchyard.billing.limits import BudgetScope, LocalLimiter, open_limiter
from switchyard.billing.store import Database, open_database
from switchyard.billing.teams import Principal, Team, yaml_keys
from switchyard.cache.entries import CacheStore
from switchyard.cache.memory_store import MemoryStore
from switchyard.cache.policy import CachePolicy
from switchyard.cache.valkey_store import ValkeyStore
from switchyard.cascade.runtime import Cascade
from switchyard.core.drift import DriftMonitor
from switchyard.core.metrics import Metrics, multiprocess_dir
from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.core.supervision import SupervisedTask
from switchyard.core.thresholds import ThresholdsFile
from switchyard.gateway.auto_router import AutoRouter
from switchyard.gateway.gauges import LiveGauges, SharedGauges
from switchyard.gateway.live_streams import LiveStreams
from switchyard.gateway.response_cache import ResponseCache
from switchyard.gateway.routings import (
    EmbedTexts,
    Routing,
    RoutingParts,
    Routings,
    ScoreBatch,
    StartupCheck,
    build_routings,
    check_startup,
)
from switchyard.gateway.saturation import SaturationGate
from switchyard.gateway.tiers import TierSlots

logger = logging.getLogger("switchyard")

__all__ = ["EmbedTexts", "ScoreBatch", "Services", "StartupCheck", "build_services", "check_startup", "model_prices"]


@dataclass(slots=True)
class Services:
    settings: Settings
    routings: Routings  # swapped whole by a reload (gateway/reload.py)
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
    metrics: Metrics = field(default_factory=Metrics)
    streams: LiveStreams = field(default_factory=LiveStreams)
    shared_gauges: SharedGauges | None = None  # one of several workers (proxy/metrics.py)
    background: list[SupervisedTask] = field(default_factory=list)
    routing_parts: RoutingParts | None = None  # what a reload builds routers on (None: offline)
    routing_history: set[tuple[str, str]] = field(default_factory=set)  # (version, role) replaced by reloads
    reloading: asyncio.Lock = field(default_factory=asyncio.Lock)
    response_cache: ResponseCache | None = None  # None: cache.mode off for every team and route

    @property
    def thresholds(self) -> ThresholdsFile | None:
        return self.routings.current.thresholds

    @property
    def auto_router(self) -> AutoRouter | None:
        """The current version's (a request is routed by the version `routings.pick` gives it)."""
        return self.routings.current.auto_router

    @property
    def cascade(self) -> Cascade | None:
        return self.routings.current.cascade

    @property
    def drift(self) -> DriftMonitor | None:
        """The current version's drift windows (core/drift.py), against its thresholds file's reference."""
        return self.routings.current.drift

    @property
    def embed_texts(self) -> EmbedTexts | None:
        """The current version's classifier embedder (switchyard.learning); None until loaded or replaced."""
        return self.routings.current.embed_texts

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
        parts = None
        routings = Routings(Routing(check.version, "current", check, None, None))
        if not is_offline:
            parts = RoutingParts(settings, registry, prices, executor, metrics, score_batch)
            routings = build_routings(parts, check)
        # closed in the reverse order: budgets settled, then the ledger flushed, then the database
        accounts = await stack.enter_async_context(_accounts(settings, is_offline))
        services = Services(
            settings=settings,
            routings=routings,
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
            metrics=metrics,
            routing_parts=parts,
        )
        stack.callback(_close_scorers, services)
        if not is_offline:
            services.response_cache = await stack.enter_async_context(_response_cache(settings))
        if multiprocess_dir() is None or is_offline:
            metrics.registry.register(LiveGauges(services))
        else:
            services.shared_gauges = SharedGauges(services)
        await _start(services, stack, is_offline)
        yield services


@contextlib.asynccontextmanager
async def _response_cache(settings: Settings) -> AsyncIterator[ResponseCache | None]:
    """The response cache, when any team or route turns it on: in the Valkey that the replicas (or
    `--workers`) share, when there is one (`billing.redis_url`), else in this process's memory."""
    policy = CachePolicy.of(settings)
    if not policy.is_on:
        yield None
        return
    url = settings.billing.valkey_url()
    store: CacheStore = (
        ValkeyStore(url, max_entries=settings.cache.max_entries)
        if url is not None
        else MemoryStore(settings.cache.max_entries)
    )
    cache = ResponseCache(policy, store)
    warming = asyncio.create_task(cache.warm())
    try:
        yield cache
    finally:
        warming.cancel()
        await asyncio.gather(warming, return_exceptions=True)
        await cache.settle()
        await store.close()


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


def _close_scorers(services: Services) -> None:
    for scorer in services.routings.scorers():
        scorer.close()


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
