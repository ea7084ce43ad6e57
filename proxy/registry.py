"""Phase two of configuration: settings become backends, keyed by public model name."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from backends.base import Backend
from backends.openai_http import OpenAIHTTPBackend, Replica
from proxy.errors import ModelNotFound
from proxy.settings import ModelSettings, Settings, UpstreamSettings


@dataclass(slots=True)
class ModelEntry:
    name: str
    backend: Backend
    backend_kind: str
    tier: str | None
    context_window: int | None


def _build_openai(model: ModelSettings, client: httpx.AsyncClient, upstream: UpstreamSettings) -> Backend:
    replicas = [
        Replica(r.base_url, r.api_key.get_secret_value() if r.api_key else None) for r in model.replica_list()
    ]
    return OpenAIHTTPBackend(
        model.name,
        replicas,
        client,
        upstream_model=model.upstream_model,
        read_timeout_s=model.read_timeout_s,
        health_timeout_s=upstream.health_timeout_s,
    )


BACKEND_BUILDERS = {"openai": _build_openai}


class ModelRegistry:
    def __init__(self, entries: list[ModelEntry]) -> None:
        self._entries = {entry.name: entry for entry in entries}

    def get(self, name: str) -> ModelEntry:
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(
                f"The model '{name}' does not exist or you do not have access to it.",
                param="model",
            )
        return entry

    def __iter__(self):
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


def build_http_client(upstream: UpstreamSettings) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=upstream.max_connections,
            max_keepalive_connections=upstream.max_keepalive_connections,
            keepalive_expiry=upstream.keepalive_expiry_s,
        ),
        timeout=httpx.Timeout(
            upstream.connect_timeout_s, read=upstream.read_timeout_s, write=30.0, pool=30.0
        ),
        trust_env=False,
    )


def build_registry(settings: Settings, client: httpx.AsyncClient) -> ModelRegistry:
    entries = [
        ModelEntry(
            name=model.name,
            backend=BACKEND_BUILDERS[model.backend](model, client, settings.upstream),
            backend_kind=model.backend,
            tier=model.tier,
            context_window=model.context_window,
        )
        for model in settings.models
    ]
    return ModelRegistry(entries)
