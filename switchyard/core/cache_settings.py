"""The response cache's settings (`cache:` and a team's `cache`; docs/cache.md), read with the rest of
the configuration by `switchyard.core.settings`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from switchyard.core.model_settings import StrictModel


def _yaml_off(value: Any) -> Any:
    """YAML 1.1 reads a bare `off` as false: `mode: off` means the mode "off"."""
    return "off" if value is False else value


CacheMode = Annotated[Literal["off", "exact", "semantic"], BeforeValidator(_yaml_off)]


class CacheRouteSettings(StrictModel):
    """One route's (a model's name, `auto` or `cascade`) response cache: its own mode, and whether
    answers to requests that are not deterministic (temperature above 0 and no seed) are kept too."""

    mode: CacheMode | None = None  # null: cache.mode (a team's own mode still wins)
    nondeterministic: bool = False


class CacheSettings(StrictModel):
    """The response cache (docs/cache.md): answers kept for requests asked again, exactly or nearly."""

    mode: CacheMode = "off"  # off | exact | semantic (semantic includes exact)
    ttl_s: float = Field(default=3600.0, gt=0)
    max_entries: int = Field(default=10_000, ge=1)  # in the in-process store; oldest used out first
    similarity: float | None = Field(default=None, gt=0, le=1)  # semantic threshold; null: the guard's default
    # the last user turn's embedding: static (MiniLM's token vectors, mean-pooled: ~0.03 ms, the
    # default classifier's) or minilm (the transformer: ~20 ms of a core, a few more true hits)
    embedder: Literal["static", "minilm"] = "static"
    scope: Literal["team", "shared"] = "team"  # shared: every team may be answered from every team's entries
    routes: dict[str, CacheRouteSettings] = Field(default_factory=dict)  # model name, auto or cascade
    hit_price_usd_per_mtok: float = Field(default=0.0, ge=0, allow_inf_nan=False)  # a hit's price, per saved token
