"""`/v1/responses` as a chat completion: the request translated in, the whole answer translated back.

Stateless: nothing is stored, so `previous_response_id`, `store: true`, `background`,
`conversation` and `prompt` are a 400 naming the parameter, as is any input item, content part or
tool Switchyard cannot turn into a chat message (hosted tools, file inputs, item references). The
stream's translation is `switchyard.gateway.responses_stream`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from switchyard.core.body_limits import BodyLimits, check_body_limits
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import InvalidRequest, SwitchyardError, UnsupportedParameter
from switchyard.core.responses_wire import ResponseObject, ResponsesRequest
from switchyard.gateway.parsing import invalid_request

STATELESS = "Switchyard's /v1/responses is stateless: it stores no responses"
# Top-level fields the chat request takes as they are; anything else unknown is forwarded too.
_SAME_IN_CHAT = ("model", "temperature", "top_p", "user", "metadata", "parallel_tool_calls", "stream")
# Fields translated below, or refused when set (none of them is a chat request's field as it is).
_TRANSLATED = (
    *("input", "instructions", "tools", "tool_choice", "text", "reasoning", "max_output_tokens"),
    *("include", "store", "truncation", "previous_response_id", "conversation", "prompt", "background"),
    "stream_options",  # {include_obfuscation}: nothing to obfuscate here; usage is always asked for
)
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class ResponseDraft:
    """What every answer to one request repeats: its id, time, and the request's own settings."""

    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(self, status: str, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status} | (
            self.echo | {"output": output} | fields
        )


def draft_for(request: ResponsesRequest) -> ResponseDraft:
    text = request.text.model_dump(exclude_none=True) if request.text is not None else {}
    echo = ResponseObject(
        id="",
        created_at=0,
        status="in_progress",
        model=request.model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        metadata=request.metadata or {},
        parallel_tool_calls=request.parallel_tool_calls is not False,
        reasoning=request.reasoning.model_dump(exclude_none=True) if request.reasoning is not None else None,
        temperature=request.temperature,
        text={"format": {"type": "text"}} | text,
        tool_choice=request.tool_choice if request.tool_choice is not None else "auto",
        tools=request.tools or [],
        top_p=request.top_p,
        user=request.user,
    ).model_dump(exclude={"id", "created_at", "status", "output", "object"})
    return ResponseDraft(echo)


# --- the request -------------------------------------------------------------------------------


def to_chat_request(request: ResponsesRequest, limits: BodyLimits) -> ChatCompletionRequest:
    """The chat completion that answers `request`, held to the same body limits as one sent directly."""
    _refuse_state(request)
    payload = request.wire_payload()
    chat: dict[str, Any] = {name: payload[name] for name in _SAME_IN_CHAT if name in payload}
    chat |= {k: v for k, v in payload.items() if k not in _SAME_IN_CHAT and k not in _TRANSLATED}
    chat["messages"] = _messages(request)
    if request.tools is not None:
        chat["tools"] = [_tool(tool, i) for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(request.tool_choice)
    if request.text is not None and request.text.format is not None:
        response_format = _response_format(request.text.format)
        if response_format is not None:
            chat["response_format"] = response_format
    if request.text is not None and request.text.verbosity is not None:
        chat["verbosity"] = request.text.verbosity
    if request.reasoning is not None and request.reasoning.effort is not None:
        chat["reasoning_effort"] = request.reasoning.effort
    if request.max_output_tokens is not None:
        chat["max_completion_tokens"] = request.max_output_tokens
    if request.stream:
        chat["stream_options"] = {"include_usage": True}  # the events report usage at the end
    try:
        check_body_limits(chat, limits)
    except InvalidRequest as exc:
        exc.param = "input" if exc.param == "messages" else exc.param
        raise
    try:
        return ChatCompletionRequest.from_payload(chat)
    except ValidationError as exc:
        raise invalid_request(exc) from exc


def _refuse_state(request: ResponsesRequest) -> None:
    payload = request.wire_payload()
    for name in ("previous_response_id", "conversation", "prompt"):
        if payload.get(name) is not None:
            raise UnsupportedParameter(f"{STATELESS}, so '{name}' cannot be used; send the whole input.", param=name)
    if request.store:
        raise UnsupportedParameter(f"{STATELESS}: send 'store': false or leave it out.", param="store")
    if payload.get("background"):
        raise UnsupportedParameter(f"{STATELESS}, so it cannot run a response in the background.", param="background")
    if payload.get("n") not in (None, 1):
        raise UnsupportedParameter("A response has one answer: 'n' cannot be used with /v1/responses.", param="n")
    if request.include:
        raise UnsupportedParameter("'include' is not supported by Switchyard's /v1/responses.", param="include")
    if request.truncation == "auto":
        raise UnsupportedParameter(
            "Switchyard's /v1/responses does not truncate input: leave 'truncation' out or send 'disabled'.",
            param="truncation",
        )


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        for i, item in enumerate(request.input):
            _add_item(messages, item, f"input[{i}]")
    if not messages:
        raise InvalidRequest(
            "'input' is empty and there are no 'instructions': there is nothing to answer.", param="input"
        )
    return messages


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        messages.append(_message(item, param))
    elif kind == "function_call":
        call = {
            "id": _string(item, "call_id", param),
            "type": "function",
            "function": {"name": _string(item, "name", param), "arguments": _string(item, "arguments", param)},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
            last.setdefault("tool_calls", []).append(call)  # calls made in one turn stay one message
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = _text_of(output, f"{param}.output") if isinstance(output, list) else None
        if output is None:
            raise InvalidRequest(f"'{param}.output' must be a string.", param=f"{param}.output")
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": output})
    elif kind == "reasoning":
        return  # a reasoning item handed back with earlier output: a chat model reads none
    else:
        raise UnsupportedParameter(
            f"Input items of type {kind!r} are not supported by Switchyard's /v1/responses "
            "(supported: message, function_call, function_call_output).",
            param=f"{param}.type",
        )


def _string(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(f"Missing or invalid '{param}.{name}': expected a string.", param=f"{param}.{name}")
    return value


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(
            f"Invalid value for '{param}.role': expected user, assistant, system or developer.", param=f"{param}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(f"'{param}.content' must be a string or a list of parts.", param=f"{param}.content")
    if role == "assistant":
        return {"role": role, "content": _text_of(content, f"{param}.content")}
    return {"role": role, "content": [_part(part, f"{param}.content[{j}]") for j, part in enumerate(content)]}


def _part(part: Any, param: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image = {"url": part["image_url"]} | ({"detail": part["detail"]} if part.get("detail") else {})
        return {"type": "image_url", "image_url": image}
    if kind in ("input_text", "output_text", "input_image"):
        what = "text" if kind != "input_image" else "image_url (file_id is not supported)"
        raise InvalidRequest(f"'{param}' needs its {what} as a string.", param=param)
    raise UnsupportedParameter(
        f"Content parts of type {kind!r} are not supported by Switchyard's /v1/responses "
        "(supported: input_text, output_text, input_image with an image_url).",
        param=f"{param}.type",
    )


def _text_of(parts: list[Any], param: str) -> str:
    """An assistant turn's or a tool output's parts as the one string a chat message takes."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text", part.get("refusal")) if kind in ("output_text", "input_text", "refusal") else None
        if not isinstance(text, str):
            raise UnsupportedParameter(f"'{param}[{j}]' must be a text part here.", param=f"{param}[{j}]")
        texts.append(text)
    return "".join(texts)


def _tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if tool.get("type") != "function":
        raise UnsupportedParameter(
            f"Tools of type {tool.get('type')!r} are not supported by Switchyard's /v1/responses (only function).",
            param=f"{param}.type",
        )
    function = {"name": _string(tool, "name", param)}
    function |= {k: tool[k] for k in ("description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest("'tool_choice' must be auto, none, required or a function.", param="tool_choice")
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}
    raise UnsupportedParameter(
        f"'tool_choice' of type {choice.get('type')!r} is not supported by Switchyard's /v1/responses.",
        param="tool_choice",
    )


def _response_format(text_format: dict[str, Any]) -> dict[str, Any] | None:
    kind = text_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(text_format.get("schema"), dict):
            raise InvalidRequest("'text.format.schema' must be a JSON schema object.", param="text.format.schema")
        schema = {"name": _string(text_format, "name", "text.format"), "schema": text_format["schema"]}
        schema |= {k: text_format[k] for k in ("strict", "description") if text_format.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest("'text.format.type' must be text, json_object or json_schema.", param="text.format.type")


_CHAT_TO_RESPONSES = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens"}


def responses_param(param: str | None) -> str | None:
    """The Responses API's name for a chat request's parameter that a refusal names (a capability
    the model lacks, the upstream's own 400): the client sent `text.format`, not `response_format`."""
    if param is None:
        return None
    if param == "messages" or param.startswith(("messages[", "messages.")):
        return "input"  # the items do not map one to one (instructions, calls merged into one turn)
    return _CHAT_TO_RESPONSES.get(param, param)


# --- the answer --------------------------------------------------------------------------------


def usage_of(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    input_tokens, output_tokens = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or input_tokens + output_tokens,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """A response's status and incomplete_details, from the chat answer's finish_reason."""
    reason = _INCOMPLETE_REASONS.get(finish_reason or "")
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def message_item(item_id: str, text: str, refusal: str | None = None, status: str = "completed") -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text or refusal is None:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.get("id") or new_id("call"),
        "name": function.get("name") or "",
        "arguments": function.get("arguments") or "",
        "status": status,
    }


def whole_response(draft: ResponseDraft, data: bytes) -> bytes:
    """A chat completion (as the upstream sent it) as a Response object."""
    completion = orjson.loads(data)
    choices = completion.get("choices") or [{}]
    if len(choices) != 1:
        raise SwitchyardError("The upstream answered with more than one choice to a /v1/responses request.")
    message = choices[0].get("message") or {}
    output = []
    text, refusal = message.get("content") or "", message.get("refusal")
    if text or refusal or not message.get("tool_calls"):
        output.append(message_item(new_id("msg"), text, refusal))
    output += [function_call_item(new_id("fc"), call) for call in message.get("tool_calls") or ()]
    status, incomplete = status_of(choices[0].get("finish_reason"))
    response = draft.response(status, output, incomplete_details=incomplete, usage=usage_of(completion.get("usage")))
    response["model"] = completion.get("model") or response["model"]
    return orjson.dumps(response)
