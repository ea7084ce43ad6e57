"""Switchyard: an OpenAI-compatible LLM routing and cascade proxy.

Everything importable lives under this namespace. The repository's top-level folders are its
subpackages: pyproject.toml maps them for installs (`core/` is `switchyard.core`, `proxy/` is
`switchyard.proxy`, and so on), and the links beside this file give tools that read the tree
(import-linter, a checkout on `sys.path`) the same shape.
"""

__version__ = "0.1.0"
