"""Liveness and readiness: whether the process runs, and what each part of it says."""

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from switchyard.proxy.app_state import services_of
from switchyard.proxy.openapi import NO_KEY

router = APIRouter()


@router.get("/health/live", openapi_extra=NO_KEY)
async def live() -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


@router.get("/health/ready", openapi_extra=NO_KEY)
async def ready(request: Request) -> Response:
    """Ready when every model's backend passed its last health probe (`server.ready_when: all`,
    the default: `auto`'s tiers and the cascade's rungs are models too), or at least one
    (`ready_when: any`). `models` shows each model's verdict and `not_ready` the names of those
    not ready yet (still loading, or down), whichever the setting. `load_failures` says, for each
    model that failed to load, why: a built-in model whose package is missing names the command that
    installs it (`switchyard models install <model>`); other failures only their class (the log has
    the rest).

    `breakers` shows each model's circuit breaker: closed, open or half-open (a model with several
    replicas is open only when all of them are); `replicas` each replica's breaker, by its label,
    for those models; `cooldowns` the seconds left of each 429 cooldown (`model` or
    `model/replica`). `ledger` says
    whether usage records are being written, or are waiting (`behind`: the database is down or
    slow; records are kept in the spill file and written when it is back). `tasks` shows each
    background task (the health watcher, vLLM's metrics scrapers): `running`, or `restarting`
    after a crash (with how many restarts and the last exception's class).
    """
    services = services_of(request)
    models = {entry.name: entry.backend.is_ready() for entry in services.registry}
    verdicts = models.values()
    is_ready = any(verdicts) if services.settings.server.ready_when == "any" else all(verdicts) and bool(models)
    body = {
        "status": "ready" if is_ready else "not_ready",
        "models": models,
        "not_ready": [name for name, ready in models.items() if not ready],
        "load_failures": {
            entry.name: failure for entry in services.registry if (failure := entry.backend.load_failure()) is not None
        },
        "breakers": services.executor.states(),
        "replicas": services.executor.replica_states(),
        "cooldowns": services.executor.cooldowns(),
        "tasks": {task.name: task.status() for task in services.background_tasks()},
    }
    if services.ledger is not None:
        status = services.ledger.status()
        body["ledger"] = {
            "behind": status.is_behind,
            "pending": status.pending,
            "spilled": status.spilled,
            # the class only: the database's own words name its host (the log has them)
            "last_error": status.last_error.partition(":")[0] if status.last_error else None,
        }
    return Response(orjson.dumps(body), status_code=200 if is_ready else 503, media_type="application/json")
