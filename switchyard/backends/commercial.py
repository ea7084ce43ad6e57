"""Commercial APIs through the `litellm` library: OpenAI, Anthropic and every provider it knows.

The client always sees OpenAI's format; LiteLLM translates requests, responses and streams.
LiteLLM's own retries are off (ours apply, see backends/resilience.py) and its exceptions become ours
in `_translate`, the one place that knows them. Prices come from LiteLLM's bundled model price map
(read locally: LITELLM_LOCAL_MODEL_COST_MAP), unless the config sets them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import traceback
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from switchyard.backends.base import AnyRequest, Backend, BackendHealth, Pick
from switchyard.backends.litellm_models import capabilities_of
from switchyard.backends.litellm_params import litellm_arguments
from switchyard.backends.litellm_tokens import count_openai, openai_tokenizer
from switchyard.backends.token_counts import TokenCount, offline_encoding, run_counter
from switchyard.core.capabilities import Capabilities
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest, as_base64
from switchyard.core.errors import (
    BackendError,
    BackendRateLimited,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
    InvalidRequest,
    UnsupportedParameter,
)
from switchyard.core.import_lock import IMPORT_LOCK
from switchyard.core.prices import Price
from switchyard.core.requests import GenerationRequest
from switchyard.core.tracing import traceparent_headers
from switchyard.core.urls import replica_label

_imported: list[Any] = []


def _litellm() -> Any:
    """The litellm module; its first import (several seconds, in `start`'s thread) holds the import
    lock the model loads hold (core/import_lock.py), later calls only read it."""
    if not _imported:
        with IMPORT_LOCK:
            # The price map would otherwise be fetched from the network at import.
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            os.environ.setdefault("LITELLM_TELEMETRY", "False")
            import litellm

            if not _imported:
                _imported.append(litellm)
    return _imported[0]


_UNSUPPORTED = re.compile(r"does not support parameters: \[['\"]?([^'\",\]]+)")


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _per_mtok(usd_per_token: object) -> float | None:
    return usd_per_token * 1e6 if isinstance(usd_per_token, int | float) else None


def _retry_after_s(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = getattr(response, "headers", {}).get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _refused_before_sending(exc: BaseException) -> bool:
    """LiteLLM reports its own validation of a request as an APIConnectionError wrapping a plain
    exception raised in LiteLLM's code; a real connection failure wraps a transport error."""
    import aiohttp
    import httpx

    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if len(chain) < 2 or any(
        isinstance(e, OSError | TimeoutError | httpx.HTTPError | aiohttp.ClientError) for e in chain
    ):
        return False
    innermost = chain[-1]
    if type(innermost) not in (Exception, ValueError, TypeError, KeyError):
        return False
    frames = traceback.extract_tb(innermost.__traceback__)
    return bool(frames) and "litellm" in frames[-1].filename and "custom_httpx" not in frames[-1].filename


class CommercialBackend(Backend):
    label: str  # one deployment, always labelled

    def __init__(
        self,
        name: str,
        litellm_model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.name = name
        self.litellm_model = litellm_model
        self.api_base = api_base
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.label = replica_label("litellm", 0)
        self._capabilities: Capabilities | None = None
        self._is_started = False

    async def start(self) -> None:
        """Import LiteLLM (several seconds) and read the model's capabilities from its map in a
        thread, so that neither the first request nor /v1/models holds up the event loop; the model
        is ready once they are read."""
        await asyncio.to_thread(self.capabilities)
        self._is_started = True

    def capabilities(self) -> Capabilities:
        """From LiteLLM's model map, offline; everything for a model it does not know
        (backends/litellm_models.py)."""
        if self._capabilities is None:
            self._capabilities = capabilities_of(_litellm(), self.litellm_model, self.api_base)
        return self._capabilities

    def price(self) -> Price | None:
        """LiteLLM's price map for this model, prompt-cache reads and writes included where it has
        them (a price in the config replaces it whole)."""
        # the map's key carries the provider for some (`mistral/…`, `gemini/…`), not for others
        # (`claude-…`, `gpt-…`); `gemini-…` alone is Vertex AI's entry
        costs = _litellm().model_cost
        entry = costs.get(self.litellm_model) or costs.get(self.litellm_model.split("/", 1)[-1]) or {}
        if "input_cost_per_token" not in entry:
            return None
        return Price(
            entry["input_cost_per_token"] * 1e6,
            entry.get("output_cost_per_token", 0.0) * 1e6,
            _per_mtok(entry.get("cache_read_input_token_cost")),
            _per_mtok(entry.get("cache_creation_input_token_cost")),
        )

    @functools.cached_property
    def _openai_tokenizer(self) -> tuple[str, str] | None:
        """(OpenAI model, tiktoken encoding) when this is an OpenAI model (backends/litellm_tokens.py)."""
        return openai_tokenizer(_litellm(), self.litellm_model, self.api_base)

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """OpenAI's models: with their own encoding, offline; every other model, approximated with
        cl100k_base (backends/litellm_tokens.py)."""
        if "_openai_tokenizer" not in vars(self):  # LiteLLM's first import takes seconds: not on the loop
            await asyncio.to_thread(lambda: self._openai_tokenizer)
        if self._openai_tokenizer is not None:
            model, encoding = self._openai_tokenizer
            counted = await run_counter(
                lambda: count_openai(_litellm(), model, encoding, request), request, encoding=encoding
            )
            if counted is not None:
                return counted
        return await super().tokenize(request)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """An OpenAI model's ids read with its encoding; other models have none (a 400)."""
        if "_openai_tokenizer" not in vars(self):
            await asyncio.to_thread(lambda: self._openai_tokenizer)
        if self._openai_tokenizer is None:
            return await super().detokenize(tokens)
        name = self._openai_tokenizer[1]
        encoding = await asyncio.to_thread(offline_encoding, name)
        if encoding is None:
            return await super().detokenize(tokens)
        try:
            return encoding.decode(list(tokens))
        except (KeyError, OverflowError) as exc:  # an id the encoding does not have
            raise InvalidRequest(
                f"The token ids hold one that {name}, the encoding of '{self.name}', does not have: {exc}",
                param="tokens",
            ) from None

    def _kwargs(self, request: AnyRequest, *, stream: bool) -> dict[str, Any]:
        if not isinstance(request, ChatCompletionRequest):
            raise InvalidRequest(f"{self.name} answers chat completions only.", param="model")
        payload = request.wire_payload()
        kwargs = litellm_arguments(_litellm(), self.name, payload, is_openai_compatible=self.is_openai_compatible)
        kwargs.update(
            model=self.litellm_model,
            messages=payload["messages"],
            stream=stream,
            api_base=self.api_base,
            api_key=self._api_key,
            timeout=self.timeout_s,
            num_retries=0,
            max_retries=0,
        )
        if stream:
            kwargs["stream_options"] = {"include_usage": True}
        trace = traceparent_headers()
        if trace:
            kwargs["extra_headers"] = {**(kwargs.get("extra_headers") or {}), **trace}
        return kwargs

    @functools.cached_property
    def is_openai_compatible(self) -> bool:
        """LiteLLM sends this provider's requests through the `openai` SDK (which merges `extra_body`)."""
        litellm = _litellm()
        try:
            provider = litellm.get_llm_provider(self.litellm_model, api_base=self.api_base)[1]
        except Exception:  # LiteLLM cannot tell: its call will say why
            return False
        return provider == "openai" or provider in litellm.openai_compatible_providers

    def _without_address(self, text: object) -> str:
        """LiteLLM's messages may quote the api_base: clients hear the label instead."""
        text = str(text)
        if self.api_base:
            host = urlsplit(self.api_base).netloc
            text = text.replace(self.api_base.rstrip("/"), self.label).replace(host, self.label) if host else text
        return text

    def _translate(self, exc: Exception) -> Exception:
        """The one place where LiteLLM's exceptions become ours."""
        litellm = _litellm()
        message = f"{self.name} ({self.litellm_model}): {self._without_address(getattr(exc, 'message', None) or exc)}"
        if isinstance(exc, litellm.UnsupportedParamsError):
            found = _UNSUPPORTED.search(str(exc))
            param = found.group(1) if found else None
            what = param or "a parameter of this request"
            return UnsupportedParameter(f"Model '{self.name}' does not support {what} ({what}).", param=param)
        if isinstance(exc, litellm.ContextWindowExceededError):
            return ContextLengthExceeded(message, param="messages")
        if isinstance(exc, litellm.RateLimitError):
            return BackendRateLimited(message, backend=self.name, retry_after_s=_retry_after_s(exc))
        if isinstance(exc, litellm.Timeout):
            return BackendTimeout(message, backend=self.name)
        if isinstance(exc, litellm.APIConnectionError) and _refused_before_sending(exc):
            # LiteLLM's own check of the request (e.g. a content part it cannot translate): the
            # client's error, a 400 that no breaker counts
            text = self._without_address(getattr(exc, "message", None) or exc).removeprefix(
                "litellm.APIConnectionError: "
            )
            return InvalidRequest(f"{self.name}: {text}", param="messages")
        if isinstance(exc, litellm.ServiceUnavailableError | litellm.APIConnectionError):
            return BackendUnavailable(message, backend=self.name, retry_after_s=_retry_after_s(exc))
        if isinstance(exc, litellm.AuthenticationError | litellm.PermissionDeniedError):
            # the provider refused the configured key, not the client's: an upstream failure, as
            # an `openai` backend reports it
            return BackendError(message, backend=self.name)
        if isinstance(exc, litellm.ContentPolicyViolationError | litellm.BadRequestError | litellm.NotFoundError):
            status = getattr(exc, "status_code", 400) or 400
            return BackendRejected(
                message,
                backend=self.name,
                status_code=status if 400 <= status < 500 else 400,
                code=_text_or_none(getattr(exc, "code", None)),  # the provider's own, when it has one
                param=_text_or_none(getattr(exc, "param", None)),
            )
        status = getattr(exc, "status_code", None)
        if status == 529 or "overloaded_error" in message:  # Anthropic's "overloaded"
            return BackendUnavailable(message, backend=self.name, retry_after_s=_retry_after_s(exc))
        return BackendError(message, backend=self.name)

    async def _embed(self, request: EmbeddingRequest) -> CompletionResult:
        """Embeddings through `litellm.aembedding`: the provider's own, in OpenAI's answer shape."""
        payload = request.wire_payload()
        # Floats from the provider (LiteLLM cannot read base64 answers, and not every provider
        # writes them); base64, when the client asked for it, is written here.
        kwargs: dict[str, Any] = {key: payload[key] for key in ("dimensions", "user") if payload.get(key) is not None}
        trace = traceparent_headers()
        if trace:
            kwargs["extra_headers"] = trace
        try:
            response = await _litellm().aembedding(
                model=self.litellm_model,
                input=payload["input"],
                api_base=self.api_base,
                api_key=self._api_key,
                timeout=self.timeout_s,
                num_retries=0,
                max_retries=0,
                **kwargs,
            )
        except Exception as exc:  # the boundary, as in complete()
            raise self._translate(exc) from exc
        body = response.model_dump(exclude_none=True)
        body.pop("_hidden_params", None)
        if payload.get("encoding_format") == "base64":
            for item in body.get("data") or ():
                item["embedding"] = as_base64(item["embedding"])
        upstream_model = body.get("model")
        body["model"] = self.name
        return CompletionResult.from_dict(body, upstream_model)

    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult:
        if isinstance(request, EmbeddingRequest):
            return await self._embed(request)
        litellm = _litellm()
        kwargs = self._kwargs(request, stream=False)
        try:
            response = await litellm.acompletion(**kwargs)
        except Exception as exc:  # the boundary: whatever LiteLLM raises becomes one of ours
            raise self._translate(exc) from exc
        body = response.model_dump(exclude_none=True)
        upstream_model = body.get("model")
        body["model"] = self.name
        return CompletionResult.from_dict(body, upstream_model)

    async def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]:
        litellm = _litellm()
        kwargs = self._kwargs(request, stream=True)
        try:
            response = await litellm.acompletion(**kwargs)
        except Exception as exc:  # the boundary, as in complete()
            raise self._translate(exc) from exc
        chunks = aiter(response)
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except Exception as exc:
                raise self._translate(exc) from exc
            body = chunk.model_dump(exclude_none=True)
            upstream_model = body.get("model")
            body["model"] = self.name
            yield StreamChunk.from_dict(body, upstream_model)

    async def health(self) -> BackendHealth:
        return BackendHealth(True, "not probed (a commercial API; its breaker tracks it)")

    def is_ready(self) -> bool:
        return self._is_started

    async def aclose(self) -> None:
        """LiteLLM caches its HTTP clients for the whole process: close them, and forget them so that
        nothing reuses a closed one (the proxy is shutting down; another app in the process, a
        test's, gets fresh ones)."""
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        litellm = _litellm()
        await close_litellm_async_clients()
        litellm.in_memory_llm_clients_cache.flush_cache()
        # Not in that cache: the module-level client some providers' streams use (Anthropic's, with
        # no client passed). Close its aiohttp session only; its transport builds a new one when used.
        module_client = vars(litellm).get("module_level_aclient")  # vars(): do not create it
        transport = getattr(getattr(module_client, "client", None), "_transport", None)
        if transport is not None and hasattr(transport, "aclose"):
            await transport.aclose()
