"""What a model can do, and what a request needs of it.

One `Capabilities` per model: derived by its backend (LiteLLM's model info, the embedded model's chat
template, the config for OpenAI-compatible upstreams), overridden key by key by the model's
`capabilities:` in the config, and shown in `/v1/models`.
"""

from __future__ import annotations

from dataclasses import dataclass

# The names used in the config, in /v1/models and in errors and route explanations.
CAPABILITY_NAMES = ("tools", "parallel_tool_calls", "json_object", "json_schema", "vision", "logprobs", "n")


@dataclass(frozen=True, slots=True)
class Capabilities:
    tools: bool = True  # `tools` / `tool_choice`, and tool calls in the history
    parallel_tool_calls: bool = True  # more than one tool call in one answer
    json_object: bool = True  # response_format json_object
    json_schema: bool = True  # response_format json_schema
    vision: bool = True  # image parts in messages
    logprobs: bool = True  # logprobs / top_logprobs
    n: bool = True  # n > 1
    context_window: int | None = None  # prompt + max_tokens, in tokens; None: unknown
