from switchyard.proxy.routes import (
    admin,
    batches,
    chat,
    completions,
    files,
    health,
    metrics,
    models,
    responses,
    usage,
)

ROUTERS = (
    chat.router,
    completions.router,
    responses.router,
    models.router,
    usage.router,
    files.router,
    batches.router,
    health.router,
    metrics.router,
    admin.router,  # last: its catch-all answers any other /admin path
)
