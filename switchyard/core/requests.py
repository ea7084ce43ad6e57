"""The requests a model answers, as one type for every layer: chat completions, completions (both
for models of kind `chat`) and embeddings (kind `embedding`)."""

from __future__ import annotations

from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.embeddings_wire import EmbeddingRequest

AnyRequest = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
GenerationRequest = ChatCompletionRequest | CompletionRequest


def kind_of(request: AnyRequest) -> str:
    """The kind of model that answers `request` (core.model_settings.MODEL_KINDS)."""
    return "embedding" if isinstance(request, EmbeddingRequest) else "chat"
