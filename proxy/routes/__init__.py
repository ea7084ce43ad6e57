from switchyard.proxy.routes import chat, completions, health, metrics, models

ROUTERS = (chat.router, completions.router, models.router, health.router, metrics.router)
