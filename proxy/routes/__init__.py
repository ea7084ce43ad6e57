from proxy.routes import chat, completions, health, models

ROUTERS = (chat.router, completions.router, models.router, health.router)
