"""The `models:` section of the configuration: one class per `backend` (a discriminated union,
`ModelSettings`), each with only that backend's keys, and what they hold (replicas, engine sizes,
speculation, vLLM's load limits, prices, capabilities, LoRA adapters). `switchyard.core.settings`
holds the rest of the file and checks the models against each other."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Discriminator, Field, SecretStr, Tag, model_validator

from switchyard.core.prices import Price
from switchyard.core.urls import has_credentials

# the embedded embedders (backend embedded), and the tokens each reads
EMBEDDED_EMBEDDING_MODELS = {"all-minilm-l6-v2": 256}


class StrictModel(BaseModel):
    """A settings object whose unknown keys are refused (the message names them)."""

    model_config = ConfigDict(extra="forbid")


class ReplicaSettings(StrictModel):
    base_url: str
    api_key: SecretStr | None = None


class SpeculationSettings(StrictModel):
    """Speculative decoding on the embedded engine's single-stream path (docs/engine.md)."""

    # drafts copied from the context, proposed by a smaller model with the same tokenizer, or none
    method: Literal["prompt_lookup", "draft_model", "off"] = "prompt_lookup"
    num_tokens: int = Field(default=8, ge=1, le=16)  # drafts verified per forward pass
    ngram: int = Field(default=3, ge=1, le=8)  # longest context suffix looked up for a draft (prompt_lookup)
    min_ngram: int = Field(default=2, ge=1, le=8)  # shortest one
    draft_model: str | None = None  # method draft_model: a built-in name, an HF folder or a GGUF file

    @model_validator(mode="after")
    def _ngram_range(self) -> SpeculationSettings:
        if self.min_ngram > self.ngram:
            raise ValueError("speculation.min_ngram may not exceed speculation.ngram")
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError("speculation.method draft_model needs speculation.draft_model (the model that drafts)")
        if self.draft_model and self.method != "draft_model":
            raise ValueError("speculation.draft_model is only read with speculation.method: draft_model")
        return self


class EngineSettings(StrictModel):
    """The embedded engine's sizes (backend `embedded`)."""

    page_size: int = Field(default=32, ge=1)  # tokens per KV-cache block
    num_blocks: int = Field(default=256, ge=1)  # KV-cache blocks: admission is counted in these
    max_batch_tokens: int = Field(default=512, ge=16)  # tokens in one forward pass
    max_queue: int = Field(default=64, ge=0)  # requests that may wait for blocks; beyond it, 503
    queue_timeout_s: float = Field(default=30.0, gt=0)
    context_window: int = Field(default=2048, ge=16)  # prompt + max_tokens limit
    default_max_tokens: int = Field(default=256, ge=1)  # when the request gives none
    threads: int | None = Field(default=None, ge=1)  # torch threads; default: all cores
    max_loras: int = Field(default=2, ge=1)  # adapters held loaded at once (each its own engine); LRU
    prefix_caching: bool = True  # reuse the KV of prompt prefixes seen before (docs/engine.md#prefix-caching)
    single_stream: bool = True  # a request alone runs as plain `generate` does, not in the paged batch
    speculation: SpeculationSettings = Field(default_factory=SpeculationSettings)  # on the single-stream path


class VLLMSettings(StrictModel):
    """What the `vllm` backend adds to `openai`: load from each replica's /metrics."""

    metrics_interval_s: float = Field(default=2.0, gt=0)
    max_waiting: int = Field(default=4, ge=0)  # more waiting requests than this: saturated
    max_kv_cache_usage: float = Field(default=0.9, gt=0, le=1)  # KV cache fuller than this: saturated
    sticky_prefix: bool = True  # one system prompt -> one replica (rendezvous hashing), unless saturated
    max_loras: int = Field(default=4, ge=1)  # adapters loaded on one replica at once (vLLM's --max-loras); LRU


class PriceSettings(StrictModel):
    input_usd_per_mtok: float = Field(ge=0)
    output_usd_per_mtok: float = Field(ge=0)
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0)  # prompt tokens read from a prompt cache
    cache_write_usd_per_mtok: float | None = Field(default=None, ge=0)  # prompt tokens written to a prompt cache

    def to_price(self) -> Price:
        return Price(
            self.input_usd_per_mtok,
            self.output_usd_per_mtok,
            self.cached_input_usd_per_mtok,
            self.cache_write_usd_per_mtok,
        )


class CapabilitySettings(StrictModel):
    """Overrides of what the backend reports the model can do (None: keep the backend's answer)."""

    tools: bool | None = None
    parallel_tool_calls: bool | None = None
    json_object: bool | None = None
    json_schema: bool | None = None
    vision: bool | None = None
    documents: bool | None = None
    logprobs: bool | None = None
    n: bool | None = None


class AdapterSettings(StrictModel):
    """A LoRA adapter on a self-hosted model: asked for by its own name, answered by its base model."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)  # a folder with the adapter (vLLM: a path or source its server can read)
    teams: list[str] | None = None  # the teams that may use it; null: every team that may use the base model
    price: PriceSettings | None = None  # default: the base model's


MODEL_KINDS = ("chat", "embedding")
SELF_HOSTED_BACKENDS = ("embedded", "vllm")  # without `hosting:`, the others count as commercial
HOSTING_LABELS = {"self": "self-hosted", "commercial": "commercial"}  # `hosting:` -> what the ledger records


class _ModelBase(StrictModel):
    """One public model name and the backend deployment(s) that serve it: what every backend takes."""

    name: str = Field(min_length=1)
    # chat: /v1/chat/completions, /v1/completions, /v1/responses; embedding: /v1/embeddings
    kind: Literal["chat", "embedding"] = "chat"
    price: PriceSettings | None = None  # for metering; backend litellm defaults to LiteLLM's price map
    fallbacks: list[str] = Field(default_factory=list)  # models that answer when this one fails
    degrade_to: str | None = None  # a smaller model for best-effort requests while this one is saturated
    tier: str | None = None
    context_window: int | None = Field(default=None, ge=1)
    # answers carry token logprobs (needed to be judged by the cascade); default: yes for
    # embedded, openai and vllm; no for litellm (most commercial APIs return none)
    logprobs: bool | None = None
    first_token_timeout_s: float | None = Field(default=None, gt=0)  # default: resilience.first_token_timeout_s
    request_timeout_s: float | None = Field(default=None, gt=0)  # default: resilience.request_timeout_s
    # a non-stream request is asked of the upstream as a stream and its answer assembled, so that
    # the first-token and stream idle timeouts guard it too (docs/resilience.md); the default: on
    # for the backends that call an upstream (openai, vllm, litellm), off for embedded (in-process)
    assemble_from_stream: bool = False
    # what the model can do, key by key over what its backend reports (core/capabilities.py)
    capabilities: CapabilitySettings = Field(default_factory=CapabilitySettings)
    # where it runs, for the reports' self-hosted against commercial; default: self for embedded and
    # vllm, commercial for openai and litellm (a vLLM behind `backend: openai` wants `self`)
    hosting: Literal["self", "commercial"] | None = None

    @property
    def hosting_label(self) -> str:
        """What the ledger records: `self-hosted` or `commercial`."""
        backend: str = self.backend  # type: ignore[attr-defined]
        return HOSTING_LABELS[self.hosting or ("self" if backend in SELF_HOSTED_BACKENDS else "commercial")]

    @property
    def has_logprobs(self) -> bool:
        return self.logprobs if self.logprobs is not None else self.backend != "litellm"  # type: ignore[attr-defined]

    @property
    def effective_context_window(self) -> int | None:
        return self.context_window


class _HTTPModel(_ModelBase):
    base_url: str | None = None
    api_key: SecretStr | None = None
    replicas: list[ReplicaSettings] | None = None
    upstream_model: str | None = None
    read_timeout_s: float | None = Field(default=None, gt=0)
    assemble_from_stream: bool = True

    @model_validator(mode="after")
    def _one_address(self) -> _HTTPModel:
        if (self.base_url is None) == (self.replicas is None):
            raise ValueError("give exactly one of 'base_url' or 'replicas'")
        if self.replicas is not None and not self.replicas:
            raise ValueError("'replicas' must list at least one replica")
        named = [("", self)] if self.replicas is None else [(f"replicas[{i}].", r) for i, r in enumerate(self.replicas)]
        for where, address in named:
            if address.api_key is not None and has_credentials(address.base_url or ""):
                raise ValueError(
                    f"model '{self.name}': {where}base_url carries credentials (user:password@) and {where}api_key "
                    "is set too; give one of them (the URL's are sent as HTTP Basic auth, api_key as a Bearer key)"
                )
        return self

    def replica_list(self) -> list[ReplicaSettings]:
        if self.replicas is not None:
            return self.replicas
        assert self.base_url is not None
        return [ReplicaSettings(base_url=self.base_url, api_key=self.api_key)]


class OpenAIModel(_HTTPModel):
    """Any OpenAI-compatible server (the default backend)."""

    backend: Literal["openai"] = "openai"


class VLLMModel(_HTTPModel):
    """vLLM's OpenAI server, balanced on its own load metrics."""

    backend: Literal["vllm"]
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    adapters: list[AdapterSettings] = Field(default_factory=list)  # LoRA adapters loaded at run time


class LiteLLMModel(_ModelBase):
    """A commercial API through LiteLLM; `base_url` is its api_base (optional)."""

    backend: Literal["litellm"]
    litellm_model: str  # e.g. openai/gpt-4o, anthropic/claude-3-5-sonnet-20241022
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    assemble_from_stream: bool = True

    @model_validator(mode="after")
    def _no_credentials_in_url(self) -> LiteLLMModel:
        if self.base_url is not None and has_credentials(self.base_url):
            raise ValueError(
                f"model '{self.name}': base_url carries credentials (user:password@); put the key in api_key"
            )
        return self


class EmbeddedModel(_ModelBase):
    """A model run in-process on the embedded CPU engine."""

    backend: Literal["embedded"]
    model: str  # a built-in name (smollm2-135m, all-minilm-l6-v2), an HF model folder, or a .gguf file
    engine: EngineSettings = Field(default_factory=EngineSettings)
    adapters: list[AdapterSettings] = Field(default_factory=list)  # LoRA adapters (peft), loaded on first use

    @model_validator(mode="after")
    def _embedding_model(self) -> EmbeddedModel:
        is_embedder = self.model.lower() in EMBEDDED_EMBEDDING_MODELS
        if is_embedder and "kind" not in self.model_fields_set:
            self.kind = "embedding"
        if is_embedder != (self.kind == "embedding"):
            raise ValueError(
                f"model '{self.name}': {self.model} is "
                + ("an embedding model: kind must be 'embedding'" if is_embedder else "not an embedding model")
                + f" (the embedded engine embeds with {', '.join(EMBEDDED_EMBEDDING_MODELS)})"
            )
        if is_embedder and self.adapters:
            raise ValueError(f"model '{self.name}': an embedding model takes no adapters")
        return self

    @property
    def effective_context_window(self) -> int | None:
        if self.kind == "embedding":
            return self.context_window or EMBEDDED_EMBEDDING_MODELS[self.model.lower()]
        return self.context_window or self.engine.context_window


BACKEND_KINDS = ("openai", "vllm", "litellm", "embedded")


def hosting_overrides(models: Iterable[AnyModelSettings]) -> dict[str, str]:
    """Model (and LoRA adapter) name -> the ledger's hosting label, for the models whose config
    sets `hosting:`: the reports apply it to their older records too."""
    overrides = {}
    for model in models:
        if model.hosting is not None:
            for name in (model.name, *(a.name for a in getattr(model, "adapters", ()))):
                overrides[name] = model.hosting_label
    return overrides


def _backend_of(value: Any) -> str:
    """The union's tag: `backend`, `openai` when left out."""
    kind = value.get("backend", "openai") if isinstance(value, dict) else getattr(value, "backend", "openai")
    return kind if kind in BACKEND_KINDS else "unknown"


class _UnknownBackend(BaseModel):
    """Stands for a `backend` no class has, so that the error names the choices."""

    model_config = ConfigDict(extra="ignore")
    backend: Literal["openai", "vllm", "litellm", "embedded"]


AnyModelSettings = OpenAIModel | VLLMModel | LiteLLMModel | EmbeddedModel

# A model's settings: one class per `backend`, each with only its own fields.
if TYPE_CHECKING:
    # _UnknownBackend never validates (its Literal refuses every tag routed to it), so a
    # validated model is always one of the four classes.
    ModelSettings: TypeAlias = AnyModelSettings
else:
    ModelSettings = Annotated[
        Annotated[OpenAIModel, Tag("openai")]
        | Annotated[VLLMModel, Tag("vllm")]
        | Annotated[LiteLLMModel, Tag("litellm")]
        | Annotated[EmbeddedModel, Tag("embedded")]
        | Annotated[_UnknownBackend, Tag("unknown")],
        Discriminator(_backend_of),
    ]
