"""What a model can do, and what a request needs of it.

One `Capabilities` per model: derived by its backend (LiteLLM's model info, the embedded model's chat
template, the config for OpenAI-compatible upstreams), overridden key by key by the model's
`capabilities:` in the config, and shown in `/v1/models`. `needs(request)` says which capabilities
a request uses and through which parameter, so that routing can skip a model that lacks one and an
explicit model that lacks one is a 400 naming that parameter (`unsupported()`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from switchyard.core.chat_wire import WireRequest
from switchyard.core.errors import UnsupportedParameter

# The names used in the config, in /v1/models and in errors and route explanations.
CAPABILITY_NAMES = (
    "tools",
    "parallel_tool_calls",
    "json_object",
    "json_schema",
    "vision",
    "documents",
    "logprobs",
    "n",
)


@dataclass(frozen=True, slots=True)
class Capabilities:
    tools: bool = True  # `tools` / `tool_choice`, and tool calls in the history
    # more than one tool call in one answer (shown, not required: a model without it makes one call)
    parallel_tool_calls: bool = True
    json_object: bool = True  # response_format json_object
    json_schema: bool = True  # response_format json_schema
    vision: bool = True  # image parts in messages
    documents: bool = True  # file parts in messages (a Messages API `document` block: a PDF)
    logprobs: bool = True  # logprobs / top_logprobs
    n: bool = True  # n > 1
    context_window: int | None = None  # prompt + max_tokens, in tokens; None: unknown

    def overridden(self, overrides: dict[str, Any]) -> Capabilities:
        """These capabilities with the keys of `overrides` that are not None replacing their own."""
        changed = {k: v for k, v in overrides.items() if k in _FIELD_NAMES and v is not None}
        return replace(self, **changed) if changed else self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lacks(self, needed: dict[str, str]) -> list[tuple[str, str]]:
        """The (capability, parameter) pairs of `needed` this model cannot serve, in CAPABILITY_NAMES order."""
        if not needed:  # most requests
            return []
        return [(name, needed[name]) for name in CAPABILITY_NAMES if name in needed and not getattr(self, name)]


_FIELD_NAMES = frozenset(f.name for f in fields(Capabilities))
EVERYTHING = Capabilities()  # what a backend that refuses for itself reports


def _has_image(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image") for part in content
    )


def _has_document(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") in ("file", "document") for part in content
    )


def _fields(request: Any) -> dict[str, Any]:
    """The request's fields: the JSON object a request was validated from, when it kept it (read
    only), else its attributes with a pydantic model's extra fields."""
    if isinstance(request, WireRequest) and (payload := request.payload) is not None:
        return payload
    extra: dict[str, Any] = getattr(request, "model_extra", None) or {}
    return {**vars(request), **extra}


def needs(request: Any) -> dict[str, str]:
    """capability -> the request parameter that needs it (`messages` for history and images).

    Works on a chat request, a legacy completion request (which needs `logprobs` and `n` only), or
    any object whose `vars()` hold the same fields; absent fields count as unset. Routing computes
    it once per request and passes it down."""
    data = _fields(request)
    found: dict[str, str] = {}
    for param, unused in (("tools", None), ("tool_choice", "none"), ("functions", None), ("function_call", "none")):
        value = data.get(param)  # functions / function_call: the legacy form of tools
        if value and value != unused:
            found["tools"] = param
            break
    response_format = data.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind in ("json_object", "json_schema"):
        found[kind] = "response_format"
    for message in data.get("messages") or ():
        if not isinstance(message, dict):
            message = vars(message) | (getattr(message, "model_extra", None) or {})
        if "tools" not in found and (message.get("role") in ("tool", "function") or message.get("tool_calls")):
            found["tools"] = "messages"
        if "vision" not in found and _has_image(message.get("content")):
            found["vision"] = "messages"
        if "documents" not in found and _has_document(message.get("content")):
            found["documents"] = "messages"
    logprobs = data.get("logprobs")  # a legacy completion's 0 asks for them too
    if (logprobs is not None and logprobs is not False) or data.get("top_logprobs"):
        found["logprobs"] = "logprobs" if logprobs is not None and logprobs is not False else "top_logprobs"
    n = data.get("n")
    if isinstance(n, int) and n > 1:
        found["n"] = "n"
    return found


def explain(lacking: list[tuple[str, str]]) -> str:
    """`tools, vision` for a route header or a message."""
    return ", ".join(name for name, _ in lacking)


def unsupported(model: str, lacking: list[tuple[str, str]]) -> UnsupportedParameter:
    """The 400 for a model asked what it cannot do: names the model and each capability it lacks
    (with its parameter); `param` is the first one's parameter."""
    what = ", ".join(f"{name} ({param})" for name, param in lacking)
    return UnsupportedParameter(f"Model '{model}' does not support {what}.", param=lacking[0][1])


def unsupported_by_any(route: str, lacking_by_model: dict[str, list[tuple[str, str]]]) -> UnsupportedParameter:
    """The 400 when no model a route may pick can serve the request (`route`: "model='auto'", …);
    `param` is the first model's first lacking parameter."""
    what = "; ".join(f"{model} lacks {explain(lacking)}" for model, lacking in lacking_by_model.items())
    first = next(iter(lacking_by_model.values()))
    return UnsupportedParameter(f"No model that {route} may pick can serve this request: {what}.", param=first[0][1])
