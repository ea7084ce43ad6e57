from switchyard.proxy.routes import admin, chat, completions, health, metrics, models, responses, usage

ROUTERS = (
    chat.router,
    completions.router,
    responses.router,
    models.router,
    usage.router,
    health.router,
    metrics.router,
    admin.router,  # last: its catch-all answers any other /admin path
)
