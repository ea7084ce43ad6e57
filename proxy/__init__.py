"""Switchyard's OpenAI-compatible proxy. The app factory is `proxy.app.create_app`."""
