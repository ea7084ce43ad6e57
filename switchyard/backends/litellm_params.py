"""How a client's chat request becomes the arguments of `litellm.acompletion`.

- OpenAI's own request fields (`OPENAI_FIELDS`) are LiteLLM's arguments: it translates them for
  the provider (`parallel_tool_calls: false` becomes Anthropic's `disable_parallel_tool_use`,
  `reasoning_effort` a reasoning model's own form) and refuses one the model cannot take
  (`UnsupportedParamsError`, which the backend turns into a 400 naming it);
- any other field is the provider's and must not steer LiteLLM (`api_base`, `callbacks`,
  `drop_params`, `aws_*`, `mock_response`... are read by LiteLLM itself): to an OpenAI-compatible
  provider every such field goes in `extra_body`, which the provider's SDK merges into the body as
  it is; to another provider it goes as an argument, which LiteLLM passes on untouched (its
  "provider-specific parameters": Anthropic's `top_k`), unless it is named like one of LiteLLM's
  settings: a 400. Except `metadata`: LiteLLM gives the provider what it accepts of it
  (Anthropic's `metadata.user_id`).
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

from switchyard.core.errors import UnsupportedParameter

OPENAI_FIELDS = frozenset(
    (
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "temperature",
        "thinking",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    )
)
SET_BY_THE_BACKEND = frozenset(("model", "messages", "stream", "stream_options"))


@functools.cache
def litellm_settings(litellm: Any) -> frozenset[str]:
    """The argument names LiteLLM reads for itself rather than sending to the provider."""
    from litellm.types.utils import all_litellm_params

    names = set(all_litellm_params) | set(inspect.signature(litellm.acompletion).parameters)
    names |= set(litellm.OPENAI_CHAT_COMPLETION_PARAMS) | {"extra_body", "extra_query", "headers", "client"}
    return frozenset(names - OPENAI_FIELDS - SET_BY_THE_BACKEND)


# Names LiteLLM (or a provider's handler in it) reads out of its keyword arguments without declaring
# them: callbacks, parameter dropping, cloud credentials and endpoints, mocks. Matched by pattern
# as well, because a new LiteLLM adds more of them.
_SETTING_NAMES = frozenset(
    (
        "additional_drop_params",
        "base_url",
        "cache",
        "caching",
        "custom_llm_provider",
        "deployment_id",
        "drop_params",
        "extra_headers",
        "model_list",
        "organization",
        "region_name",
        "timeout",
    )
)
_SETTING_PREFIXES = (
    "litellm",
    "_",
    "api_",
    "aws_",
    "azure_",
    "vertex_",
    "watsonx_",
    "mock_",
    "input_cost",
    "output_cost",
)


def is_litellm_setting(litellm: Any, name: str) -> bool:
    return (
        name in litellm_settings(litellm)
        or name in _SETTING_NAMES
        or name.startswith(_SETTING_PREFIXES)
        or "callback" in name
    )


def litellm_arguments(
    litellm: Any, model: str, payload: dict[str, Any], *, is_openai_compatible: bool
) -> dict[str, Any]:
    """The client's fields of `payload` as arguments (model, messages and stream are the caller's)."""
    arguments: dict[str, Any] = {}
    extra_body: dict[str, Any] = {}
    for name, value in payload.items():
        if name in SET_BY_THE_BACKEND:
            continue
        if name in OPENAI_FIELDS:
            arguments[name] = value
        elif is_openai_compatible:  # the SDK merges extra_body into the body; LiteLLM never reads it
            extra_body[name] = value
        elif not is_litellm_setting(litellm, name):
            arguments[name] = value
        elif name == "metadata":
            arguments[name] = copy.deepcopy(value)  # LiteLLM writes its own keys into it
        else:
            raise UnsupportedParameter(
                f"Model '{model}' does not support {name} ({name}): LiteLLM cannot send a field of that name to "
                "this provider.",
                param=name,
            )
    if extra_body:
        arguments["extra_body"] = extra_body
    return arguments
