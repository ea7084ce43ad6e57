"""Phase two of configuration: settings become backends, keyed by public model name."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from backends.base import Backend
from backends.openai_http import OpenAIHTTPBackend, Replica
from proxy.errors import ModelNotFound
from proxy.settings import EngineSettings, ModelSettings, Settings, UpstreamSettings, VLLMSettings


@dataclass(slots=True)
class ModelEntry:
    name: str
    backend: Backend
    backend_kind: str
    tier: str | None
    context_window: int | None


def _http_backend_kwargs(model: ModelSettings, upstream: UpstreamSettings) -> dict:
    return {
        "upstream_model": model.upstream_model,
        "read_timeout_s": model.read_timeout_s,
        "health_timeout_s": upstream.health_timeout_s,
    }


def _replicas(model: ModelSettings, replica_type: type[Replica]) -> list:
    return [replica_type(r.base_url, r.api_key.get_secret_value() if r.api_key else None) for r in model.replica_list()]


def _build_openai(model: ModelSettings, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    return OpenAIHTTPBackend(model.name, _replicas(model, Replica), session, **_http_backend_kwargs(model, upstream))


def _build_vllm(model: ModelSettings, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    from backends.vllm import SaturationLimits, VLLMBackend, VLLMReplica

    options = model.vllm or VLLMSettings()
    return VLLMBackend(
        model.name,
        _replicas(model, VLLMReplica),
        session,
        **_http_backend_kwargs(model, upstream),
        metrics_interval_s=options.metrics_interval_s,
        limits=SaturationLimits(options.max_waiting, options.max_kv_cache_usage),
        is_sticky=options.sticky_prefix,
    )


def _build_embedded(model: ModelSettings, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    from backends.embedded.backend import EmbeddedBackend
    from backends.embedded.engine import EngineLimits

    engine = model.engine or EngineSettings()
    limits = EngineLimits(
        page_size=engine.page_size,
        num_blocks=engine.num_blocks,
        max_batch_tokens=engine.max_batch_tokens,
        max_queue=engine.max_queue,
        queue_timeout_s=engine.queue_timeout_s,
        context_window=model.context_window or engine.context_window,
    )
    assert model.model is not None
    return EmbeddedBackend(
        model.name, model.model, limits, default_max_tokens=engine.default_max_tokens, num_threads=engine.threads
    )


def _build_litellm(model: ModelSettings, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    from backends.commercial import CommercialBackend

    assert model.litellm_model is not None
    return CommercialBackend(
        model.name,
        model.litellm_model,
        api_base=model.base_url,
        api_key=model.api_key.get_secret_value() if model.api_key else None,
        timeout_s=model.timeout_s,
    )


BACKEND_BUILDERS = {
    "openai": _build_openai,
    "vllm": _build_vllm,
    "embedded": _build_embedded,
    "litellm": _build_litellm,
}


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


def build_http_session(upstream: UpstreamSettings) -> aiohttp.ClientSession:
    """The one pooled HTTP session every HTTP backend shares; call inside the running loop."""
    connector = aiohttp.TCPConnector(
        limit=upstream.max_connections, keepalive_timeout=upstream.keepalive_expiry_s, ttl_dns_cache=300
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=upstream.connect_timeout_s, sock_read=upstream.read_timeout_s
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)


def build_registry(settings: Settings, session: aiohttp.ClientSession) -> ModelRegistry:
    entries = [
        ModelEntry(
            name=model.name,
            backend=BACKEND_BUILDERS[model.backend](model, session, settings.upstream),
            backend_kind=model.backend,
            tier=model.tier,
            context_window=model.context_window or (model.engine or EngineSettings()).context_window
            if model.backend == "embedded"
            else model.context_window,
        )
        for model in settings.models
    ]
    return ModelRegistry(entries)
