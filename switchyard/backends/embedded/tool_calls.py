"""Tools on the embedded engine: the history rendered for the chat template, the grammar of a forced
call, and the model's answer read back as OpenAI `tool_calls`.

A call is written as one JSON object `{"name": ..., "arguments": {...}}` (optionally inside
`<tool_call>` tags, as Hermes-style templates ask, or a markdown code fence, as small Qwen models
write it). With `tool_choice` "required" or a named
function the answer is decoded under that shape's JSON schema (`call_schema`), so even a small model
produces a valid call; with "auto" the model writes freely and an answer that reads as a call is one.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from switchyard.core.chat_wire import ChatCompletionRequest, message_text
from switchyard.core.errors import InvalidRequest

_TAGGED = re.compile(r"^\s*<tool_call>(.*?)</tool_call>\s*$", re.DOTALL)
_FENCED = re.compile(r"^\s*```(?:json)?\s*\n(.*?)```\s*$", re.DOTALL)


def renders_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template does anything with `tools` (HF templates receive them as
    the variable `tools`; one that never names it drops them)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one, or a "tool_use" variant
        return "tool_use" in template or any("tools" in t for t in template.values())
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def uses_tools(request: ChatCompletionRequest) -> bool:
    """Tools offered and not turned off: the answer may be a call."""
    return bool(request.tools) and request.tool_choice != "none"


def hf_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages as HF chat templates take them: assistant `tool_calls` with their arguments as
    objects, `tool` results with their call id and name."""
    names_by_call_id: dict[str, str] = {}
    messages = []
    for message in request.messages:
        extra = message.model_extra or {}
        rendered: dict[str, Any] = {"role": message.role, "content": message_text(message.content)}
        if message.name:
            rendered["name"] = message.name
        calls = extra.get("tool_calls")
        if message.role == "assistant" and calls:
            rendered["tool_calls"] = [_hf_call(call) for call in calls]
            for call in calls:
                names_by_call_id[call.get("id", "")] = call.get("function", {}).get("name", "")
        if message.role == "tool":
            call_id = extra.get("tool_call_id", "")
            rendered["tool_call_id"] = call_id
            rendered.setdefault("name", names_by_call_id.get(call_id, ""))
        messages.append(rendered)
    return messages


def _hf_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        pass  # not JSON: the template gets the text as sent
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": arguments},
    }


def hf_tools(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    return [tool for tool in request.tools or () if tool.get("type") == "function"]


def call_schema(request: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema a forced call is decoded under; None when the model may answer freely."""
    choice = request.tool_choice
    functions = [tool["function"] for tool in hf_tools(request) if tool.get("function", {}).get("name")]
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        functions = [f for f in functions if f["name"] == wanted]
        if not functions:
            raise InvalidRequest(f"tool_choice names a function that is not in tools: {wanted!r}", param="tool_choice")
    elif choice != "required":
        return None
    if not functions:
        raise InvalidRequest("tool_choice 'required' needs at least one function in tools.", param="tools")
    shapes = [_call_shape(f) for f in functions]
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def _call_shape(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [function["name"]]}, "arguments": parameters},
        "required": ["name", "arguments"],
    }


def parse_tool_calls(text: str, request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The calls an answer makes, as OpenAI `tool_calls`; [] when it is not (only) calls of the offered
    functions."""
    names = {tool["function"].get("name") for tool in hf_tools(request) if tool.get("function")}
    wrapped = _TAGGED.match(text) or _FENCED.match(text)
    body = wrapped.group(1) if wrapped else text
    try:
        found = json.loads(body)
    except ValueError:
        return []
    found = found if isinstance(found, list) else [found]
    calls = []
    for item in found:
        if not isinstance(item, dict) or item.get("name") not in names:
            return []
        arguments = item.get("arguments", item.get("parameters", {}))
        if not isinstance(arguments, dict):
            return []
        calls.append(
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": item["name"], "arguments": json.dumps(arguments)},
            }
        )
    return calls
