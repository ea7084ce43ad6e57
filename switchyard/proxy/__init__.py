"""The HTTP layer: the app factory `switchyard.proxy.app.create_app`, its routes, and the composition root."""
