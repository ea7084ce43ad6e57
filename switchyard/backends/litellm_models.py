"""What a commercial model can do, from LiteLLM's bundled model map (read offline, never fetched).

A model the map knows gets what the map says: tools, parallel tool calls, vision and JSON schema
from its `supports_*` flags; JSON mode, logprobs and `n` from the OpenAI parameters LiteLLM can send
to that provider for it; the context window from `max_input_tokens`. A model it does not know (a
private fine-tune, a model newer than the installed LiteLLM, any OpenAI-compatible server) is
trusted with everything, like any OpenAI-compatible upstream: it refuses what it cannot do itself,
and the config's `capabilities:` can say otherwise.
"""

from __future__ import annotations

from typing import Any

from switchyard.core.capabilities import Capabilities


def capabilities_of(litellm: Any, litellm_model: str, api_base: str | None = None) -> Capabilities:
    try:
        model, provider, _, _ = litellm.get_llm_provider(litellm_model, api_base=api_base)
        info = litellm.get_model_info(model=model, custom_llm_provider=provider)
    except Exception:  # LiteLLM raises plain Exceptions for a model it does not map
        return Capabilities()
    where = {"model": model, "custom_llm_provider": provider}
    supported = set(litellm.get_supported_openai_params(**where) or ())
    return Capabilities(
        tools=bool(litellm.supports_function_calling(**where)),
        parallel_tool_calls=bool(litellm.supports_parallel_function_calling(**where)),
        json_object="response_format" in supported,
        json_schema=bool(litellm.supports_response_schema(**where)),
        vision=bool(litellm.supports_vision(**where)),
        documents=bool(litellm.supports_pdf_input(**where)),
        logprobs="logprobs" in supported,
        n="n" in supported,
        context_window=info.get("max_input_tokens"),  # LiteLLM's max_tokens is often the output limit
    )
