"""Phase two of configuration: settings become backends, keyed by public model name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from switchyard.backends.base import Backend
from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.core.capabilities import Capabilities
from switchyard.core.errors import ModelNotFound
from switchyard.core.model_settings import AnyModelSettings, EmbeddedModel, LiteLLMModel, OpenAIModel, VLLMModel
from switchyard.core.request_context import Team
from switchyard.core.settings import Settings, UpstreamSettings


@dataclass(slots=True)
class ModelEntry:
    name: str
    backend: Backend
    backend_kind: str
    tier: str | None
    context_window: int | None
    first_token_timeout_s: float | None = None  # None: resilience.first_token_timeout_s
    request_timeout_s: float | None = None  # None: resilience.request_timeout_s
    assemble_from_stream: bool = False  # a non-stream request is asked as a stream (backends/assemble.py)
    # the config's `capabilities:` (and `logprobs:`), key by key over what the backend reports
    capability_overrides: dict[str, Any] = field(default_factory=dict)
    kind: str = "chat"  # chat | embedding (core.model_settings.MODEL_KINDS)
    parent: str | None = None  # a LoRA adapter's base model
    teams: frozenset[str] | None = None  # an adapter's teams (None: whoever may use its base model)
    hosting: str | None = None  # self-hosted | commercial, as the ledger records it (None: by backend_kind)
    # (what the backend reported, what that makes with the overrides): rebuilt when the report changes
    _capabilities: tuple[Capabilities, Capabilities] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def capabilities(self) -> Capabilities:
        """What this model can do: asked of the backend each time (an embedded model knows its chat
        template only once loaded), with the config's overrides and the entry's context window."""
        reported = self.backend.capabilities()
        cached = self._capabilities
        if cached is not None and (cached[0] is reported or cached[0] == reported):
            return cached[1]
        merged = reported.overridden(self.capability_overrides).overridden({"context_window": self.context_window})
        self._capabilities = (reported, merged)
        return merged

    def open_to(self, team: Team | None) -> bool:
        """Whether `team` may use this model (None: no teams configured). An adapter: a team that
        may use it or its base model, and that its `teams` name, when they are given."""
        if team is None:
            return True
        if self.teams is not None and team.name not in self.teams:
            return False
        return team.may_use(self.name) or (self.parent is not None and team.may_use(self.parent))


def _http_backend_kwargs(model: OpenAIModel | VLLMModel, upstream: UpstreamSettings) -> dict:
    return {
        "upstream_model": model.upstream_model,
        "read_timeout_s": model.read_timeout_s,
        "stream_idle_timeout_s": upstream.stream_idle_timeout_s,  # see _upstream_for
        "health_timeout_s": upstream.health_timeout_s,
    }


def _replicas(model: OpenAIModel | VLLMModel, replica_type: type[Replica]) -> list:
    return [replica_type(r.base_url, r.api_key.get_secret_value() if r.api_key else None) for r in model.replica_list()]


def _build_openai(model: OpenAIModel, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    return OpenAIHTTPBackend(model.name, _replicas(model, Replica), session, **_http_backend_kwargs(model, upstream))


def _build_vllm(model: VLLMModel, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    from switchyard.backends.vllm import SaturationLimits, VLLMBackend, VLLMReplica

    options = model.vllm
    return VLLMBackend(
        model.name,
        _replicas(model, VLLMReplica),
        session,
        **_http_backend_kwargs(model, upstream),
        metrics_interval_s=options.metrics_interval_s,
        limits=SaturationLimits(options.max_waiting, options.max_kv_cache_usage),
        is_sticky=options.sticky_prefix,
        max_loras=options.max_loras,
    )


def _build_embedded(model: EmbeddedModel, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    if model.kind == "embedding":
        from switchyard.backends.embedded.embedding import EmbeddingBackend

        return EmbeddingBackend(model.name, num_threads=model.engine.threads)
    from switchyard.backends.embedded.adapters import AdaptableEmbeddedBackend
    from switchyard.backends.embedded.engine import EngineLimits
    from switchyard.backends.embedded.speculation import Speculation

    engine = model.engine
    limits = EngineLimits(
        page_size=engine.page_size,
        num_blocks=engine.num_blocks,
        max_batch_tokens=engine.max_batch_tokens,
        max_queue=engine.max_queue,
        queue_timeout_s=engine.queue_timeout_s,
        context_window=model.effective_context_window or engine.context_window,
        prefix_caching=engine.prefix_caching,
        single_stream=engine.single_stream,
        speculation=Speculation(
            engine.speculation.method,
            engine.speculation.num_tokens,
            engine.speculation.ngram,
            engine.speculation.min_ngram,
            engine.speculation.draft_model,
        ),
    )
    return AdaptableEmbeddedBackend(
        model.name,
        model.model,
        limits,
        default_max_tokens=engine.default_max_tokens,
        num_threads=engine.threads,
        max_loras=engine.max_loras,
    )


def _build_litellm(model: LiteLLMModel, session: aiohttp.ClientSession, upstream: UpstreamSettings) -> Backend:
    from switchyard.backends.commercial import CommercialBackend

    return CommercialBackend(
        model.name,
        model.litellm_model,
        api_base=model.base_url,
        api_key=model.api_key.get_secret_value() if model.api_key else None,
        timeout_s=model.timeout_s,
    )


BACKEND_BUILDERS: dict[str, Callable[..., Backend]] = {
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

    def find(self, name: str) -> ModelEntry | None:
        """The model named `name`, or None (no error: for labels and look-ups that may miss)."""
        return self._entries.get(name)

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


def _upstream_for(model: AnyModelSettings, settings: Settings) -> UpstreamSettings:
    """A model waits in silence for its first token as long as its first-token timeout (its own,
    else resilience's): the stream idle timeout must not cut that wait first, as a plain read
    timeout that would be retried on the same hung model."""
    first_token_s = model.first_token_timeout_s
    if first_token_s is None:
        first_token_s = settings.resilience.first_token_timeout_s
    upstream = settings.upstream
    if first_token_s is None or first_token_s <= upstream.stream_idle_timeout_s:
        return upstream
    return upstream.model_copy(update={"stream_idle_timeout_s": first_token_s})


def _capability_overrides(model: AnyModelSettings) -> dict[str, Any]:
    overrides = model.capabilities.model_dump(exclude_none=True)
    if model.logprobs is not None:  # the older key says the same as capabilities.logprobs
        overrides.setdefault("logprobs", model.logprobs)
    return overrides


def build_registry(
    settings: Settings,
    session: aiohttp.ClientSession,
    *,
    backends: Mapping[str, Backend] | None = None,
    only: Sequence[str] | None = None,
) -> ModelRegistry:
    """A backend per configured model (`only` these, when given); `backends` replaces the built ones by name."""
    given = backends or {}
    entries = []
    for model in settings.models:
        if only is not None and model.name not in only:
            continue
        entry = ModelEntry(
            name=model.name,
            backend=given.get(model.name)
            or BACKEND_BUILDERS[model.backend](model, session, _upstream_for(model, settings)),
            backend_kind=model.backend,
            tier=model.tier,
            context_window=model.effective_context_window,
            first_token_timeout_s=model.first_token_timeout_s,
            request_timeout_s=model.request_timeout_s,
            assemble_from_stream=model.assemble_from_stream,
            capability_overrides=_capability_overrides(model),
            kind=model.kind,
            hosting=model.hosting_label,
        )
        entries.append(entry)
        for adapter in getattr(model, "adapters", ()):
            entries.append(_adapter_entry(entry, adapter.name, adapter.path, adapter.teams, given))
    return ModelRegistry(entries)


def _adapter_entry(
    base: ModelEntry, name: str, source: str, teams: Sequence[str] | None, given: Mapping[str, Backend]
) -> ModelEntry:
    """A LoRA adapter: a model of its own name, on its base model's backend, with its base's limits."""
    return replace(
        base,
        name=name,
        backend=given.get(name) or base.backend.adapter(name, source),
        tier=None,  # `auto` reaches an adapter through a team's default_adapters only
        parent=base.name,
        teams=frozenset(teams) if teams is not None else None,
    )
