"""Counting a commercial model's prompt tokens offline: OpenAI's models with their own encodings, the
others approximated.

LiteLLM knows which provider serves a model; tiktoken knows an OpenAI model's encoding. An OpenAI
model's prompt is counted with that encoding (cl100k_base or o200k_base, read from local copies,
never downloaded: `token_counts.offline_encoding`): exactly for a prompt, and for text messages to
the models whose chat format OpenAI documents the accounting of (gpt-3.5-turbo, gpt-4*); with
LiteLLM's counter, marked approximate, for the rest (tools, tool calls, images; the o-series and
gpt-5 models). LiteLLM's counter is not used for the exact counts: it encodes text in pieces of
1,024 characters, and drifts by about a token at each cut.

Every other provider's model is counted with cl100k_base, marked approximate: Anthropic's and
Google's tokenizers are not public, and the ones LiteLLM's counter would use for Llama and Cohere
models come from the Hugging Face hub at the first count.
"""

from __future__ import annotations

import re
from typing import Any

from switchyard.backends.token_counts import (
    TokenCount,
    count_chat_format,
    count_prompt,
    offline_encoding,
)
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest
from switchyard.core.requests import GenerationRequest

OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})
OFFLINE_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})
DOCUMENTED_CHAT_FORMAT = re.compile(r"gpt-3\.5-turbo|gpt-4")  # at the start of the model's name
TEXT_ROLES = frozenset({"system", "developer", "user", "assistant"})


def openai_tokenizer(litellm: Any, litellm_model: str, api_base: str | None) -> tuple[str, str] | None:
    """(the OpenAI model's name, its tiktoken encoding) when LiteLLM calls OpenAI (or Azure OpenAI)
    for `litellm_model` and the encoding is one Switchyard reads offline; else None."""
    import tiktoken

    try:
        model, provider, _, _ = litellm.get_llm_provider(litellm_model, api_base=api_base)
        encoding = tiktoken.encoding_name_for_model(model)
    except Exception:  # LiteLLM cannot tell the provider, or tiktoken does not know the model
        return None
    if provider not in OPENAI_PROVIDERS or encoding not in OFFLINE_ENCODINGS:
        return None
    return model, encoding


def count_openai(litellm: Any, model: str, encoding_name: str, request: GenerationRequest) -> TokenCount | None:
    """`request`'s prompt tokens at the OpenAI model `model` (blocking); None when the encoding has
    no local copy."""
    encoding = offline_encoding(encoding_name)
    if encoding is None:
        return None
    if isinstance(request, CompletionRequest):
        ids = count_prompt(encoding, request)
        return TokenCount(len(ids), ids, tokenizer=encoding_name)
    if DOCUMENTED_CHAT_FORMAT.match(model) and _is_text_only(request):
        # the first gpt-3.5-turbo wrote a message's name in place of its role
        is_legacy = model.startswith("gpt-3.5-turbo-0301")
        count = count_chat_format(
            encoding, request, tokens_per_message=4 if is_legacy else 3, tokens_per_name=-1 if is_legacy else 1
        )
        return TokenCount(count, tokenizer=encoding_name)
    payload = request.wire_payload()
    try:
        count = litellm.token_counter(
            model=model,
            messages=payload["messages"],
            tools=payload.get("tools"),
            tool_choice=payload.get("tool_choice"),
            # never LiteLLM's choice of tokenizer (some it would fetch), nor an image fetched to size it
            custom_tokenizer={"type": "openai_tokenizer", "tokenizer": encoding},
            use_default_image_token_count=True,
        )
    except Exception:  # content LiteLLM's counter cannot read: the JSON of what it holds, counted
        count = count_chat_format(encoding, request)
    return TokenCount(count, is_approximate=True, tokenizer=encoding_name)


def _is_text_only(request: ChatCompletionRequest) -> bool:
    """Messages of text alone (no tool calls, results or images), and no tools offered."""
    return not request.tools and all(
        message.role in TEXT_ROLES and not message.model_extra and not isinstance(message.content, list)
        for message in request.messages
    )
