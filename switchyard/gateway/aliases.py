"""`model_aliases`: the model names clients send (`claude-3-5-haiku-latest`) as this proxy's models.

Patterns are globs (`fnmatch`, case-sensitive), tried in the config's order; the first match wins.
A configured model's own name, `auto` and `cascade` are never aliased. Applied before routing, to
every model endpoint's request (chat, completions, responses, messages, embeddings, batch lines,
token counts).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from switchyard.core.settings import ModelAlias
from switchyard.gateway.auto_router import CASCADE_MODEL
from switchyard.gateway.services import Services

ALIAS_HEADER = "x-switchyard-alias"  # the model an alias resolved the request's to


def alias_of(services: Services, name: str) -> ModelAlias | None:
    """What `name` resolves to, None when it is used as it is."""
    aliases = services.settings.model_aliases
    if not aliases or name in ("auto", CASCADE_MODEL) or services.registry.find(name) is not None:
        return None
    for pattern, target in aliases.items():
        if fnmatchcase(name, pattern):
            return target if isinstance(target, ModelAlias) else ModelAlias(model=target)
    return None
