"""Switchyard: an OpenAI-compatible LLM routing and cascade proxy.

Everything importable lives under this namespace; the repository's top-level folders map into it
(`core/` is `switchyard.core`, `proxy/` is `switchyard.proxy`, and so on: see pyproject.toml).
"""

__version__ = "0.1.0"
