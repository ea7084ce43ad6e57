from switchyard.proxy.routes import (
    admin,
    batches,
    chat,
    completions,
    embeddings,
    feedback,
    files,
    health,
    metrics,
    models,
    report,
    responses,
    tokenizing,
    usage,
)

ROUTERS = (
    chat.router,
    completions.router,
    embeddings.router,
    responses.router,
    models.router,
    tokenizing.router,
    usage.router,
    feedback.router,
    report.router,
    files.router,
    batches.router,
    health.router,
    metrics.router,
    admin.router,  # last: its catch-all answers any other /admin path
)
