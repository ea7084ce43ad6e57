"""`/v1/messages` as a chat completion: the request translated in, the whole answer translated back.

In: `system` becomes a system message; text and image blocks content parts; `tool_use` blocks an
assistant turn's `tool_calls`; `tool_result` blocks `tool` messages; `tools` function tools;
`stop_sequences` `stop`; `metadata.user_id` `user`. `cache_control` stays on the parts and tools
that carry it, and `thinking` and `top_k` on the request, for the backends that take them (an
Anthropic model through LiteLLM). A block Switchyard cannot turn into a chat message is a 400
naming it. The stream's translation is `switchyard.gateway.messages_stream`.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from pydantic import ValidationError

from switchyard.billing.teams import Principal
from switchyard.core.body_limits import BodyLimits, check_body_limits
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import InvalidRequest, SwitchyardError, UnsupportedParameter
from switchyard.core.messages_wire import CountTokensRequest, MessagesRequest
from switchyard.core.tokenize_wire import TokenizeRequest, TokenizeResponse
from switchyard.gateway.aliases import alias_of
from switchyard.gateway.parsing import invalid_request
from switchyard.gateway.services import Services
from switchyard.gateway.tokenizing import CHAT_FIELDS, count_tokens

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
# Fields translated below; any other unknown field is forwarded as it came, as for chat.
_TRANSLATED = frozenset(
    ("model", "messages", "system", "max_tokens", "metadata", "stop_sequences", "stream", "tools", "tool_choice")
)
_MEDIA_PARTS = ("image", "document")


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


# --- the request -------------------------------------------------------------------------------


def to_chat_request(request: MessagesRequest | CountTokensRequest, limits: BodyLimits) -> ChatCompletionRequest:
    """The chat completion that answers `request`, held to the same body limits as one sent directly."""
    payload = request.wire_payload()
    chat: dict[str, Any] = {k: v for k, v in payload.items() if k not in _TRANSLATED}
    chat["model"] = request.model
    chat["messages"] = _system(request.system) + _messages(payload["messages"])
    if isinstance(request, MessagesRequest):
        chat["max_tokens"] = request.max_tokens
        if request.stop_sequences:
            chat["stop"] = request.stop_sequences
        if request.metadata is not None and request.metadata.user_id is not None:
            chat["user"] = request.metadata.user_id
        if request.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}  # message_delta reports usage at the end
    if request.thinking is not None and request.thinking.get("type") == "disabled":
        chat.pop("thinking")  # the default everywhere: a backend without thinking need not be told
    if request.tools:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools)]
    if request.tool_choice is not None:
        choice, parallel = _tool_choice(request.tool_choice)
        if choice is not None:
            chat["tool_choice"] = choice
        if parallel is False and request.tools:
            chat["parallel_tool_calls"] = False
    try:
        check_body_limits(chat, limits)
        return ChatCompletionRequest.from_payload(chat)
    except ValidationError as exc:
        raise invalid_request(exc) from exc


def _system(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if not system:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": [_text_part(block, f"system[{i}]") for i, block in enumerate(system)]}]


def _messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param, content = f"messages[{i}]", message["content"]
        if isinstance(content, str):
            chat.append({"role": message["role"], "content": content})
        elif message["role"] == "system":  # a system message where it stands, as chat takes one
            parts = [_text_part(block, f"{param}.content[{j}]") for j, block in enumerate(content)]
            chat.append({"role": "system", "content": parts})
        elif message["role"] == "assistant":
            chat.append(_assistant(content, f"{param}.content"))
        else:
            chat += _user(content, f"{param}.content")
    if not chat:
        raise InvalidRequest("'messages' is empty: there is nothing to answer.", param="messages")
    return chat


def _kind(block: Any, param: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise InvalidRequest(f"'{param}' must be a content block with a 'type'.", param=param)
    return kind


def _text_part(block: Any, param: str) -> dict[str, Any]:
    if _kind(block, param) != "text" or not isinstance(block.get("text"), str):
        raise InvalidRequest(f"'{param}' must be a text block.", param=param)
    return _with_cache_control({"type": "text", "text": block["text"]}, block)


def _with_cache_control(part: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    """`part`, with the block's prompt-cache breakpoint (LiteLLM hands it to Anthropic; other
    backends read past it)."""
    if block.get("cache_control") is not None:
        part["cache_control"] = block["cache_control"]
    return part


def _user(content: list[Any], param: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages (first, as the calls they answer came
    just before), the rest as one user message."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = _kind(block, where)
        if kind == "tool_result":
            results.append(_tool_result(block, where))
        elif kind == "text":
            parts.append(_text_part(block, where))
        elif kind in _MEDIA_PARTS:
            parts.append(_media_part(block, kind, where))
        else:
            raise UnsupportedParameter(
                f"Content blocks of type {kind!r} are not supported in a user turn by Switchyard's /v1/messages "
                "(supported: text, image, document, tool_result).",
                param=f"{where}.type",
            )
    chat = results
    if parts:
        chat.append({"role": "user", "content": parts})
    return chat


def _media_part(block: dict[str, Any], kind: str, param: str) -> dict[str, Any]:
    source = block.get("source")
    source_kind = source.get("type") if isinstance(source, dict) else None
    if source_kind == "base64" and isinstance(source.get("data"), str):  # type: ignore[union-attr]
        assert isinstance(source, dict)
        url = f"data:{source.get('media_type') or 'application/octet-stream'};base64,{source['data']}"
    elif source_kind == "url" and isinstance(source.get("url"), str):  # type: ignore[union-attr]
        assert isinstance(source, dict)
        url = source["url"]
    else:
        raise UnsupportedParameter(
            f"'{param}.source' must be a base64 or url source (file ids and text sources are not supported).",
            param=f"{param}.source",
        )
    if kind == "image":
        return _with_cache_control({"type": "image_url", "image_url": {"url": url}}, block)
    return _with_cache_control({"type": "file", "file": {"file_data": url}}, block)


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"Missing or invalid '{param}.tool_use_id'.", param=f"{param}.tool_use_id")
    content = block.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        content = [_text_part(part, f"{param}.content[{k}]") for k, part in enumerate(content)]
        if not any("cache_control" in part for part in content):
            content = "".join(part["text"] for part in content)
    elif not isinstance(content, str):
        raise InvalidRequest(f"'{param}.content' must be a string or text blocks.", param=f"{param}.content")
    if block.get("is_error") and isinstance(content, str):
        content = f"Error: {content}"  # a chat tool message has no error flag: the model reads it
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant(content: list[Any], param: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = _kind(block, where)
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise InvalidRequest(f"'{where}' needs an 'id' and a 'name'.", param=where)
            arguments = orjson.dumps(block.get("input") or {}).decode()
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(block)  # LiteLLM hands them back to Anthropic (tool use needs them); others read none
        else:
            raise UnsupportedParameter(
                f"Content blocks of type {kind!r} are not supported in an assistant turn by Switchyard's "
                "/v1/messages (supported: text, tool_use, thinking).",
                param=f"{where}.type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def _tool(tool: Any, param: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise UnsupportedParameter(
            f"Tools of type {kind!r} are not supported by Switchyard's /v1/messages (only client tools "
            "with an input_schema).",
            param=f"{param}.type",
        )
    name = tool.get("name")
    if not isinstance(name, str) or not isinstance(tool.get("input_schema"), dict):
        raise InvalidRequest(f"'{param}' needs a 'name' and an 'input_schema' object.", param=param)
    function = {"name": name, "parameters": tool["input_schema"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return _with_cache_control({"type": "function", "function": function}, tool)


def _tool_choice(choice: dict[str, Any]) -> tuple[str | dict[str, Any] | None, bool | None]:
    """The chat `tool_choice`, and whether parallel calls are allowed (None: not said)."""
    kind = choice.get("type")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise InvalidRequest("'tool_choice.type' must be auto, any, tool (with a name) or none.", param="tool_choice")


_CHAT_TO_MESSAGES = {"stop": "stop_sequences", "user": "metadata.user_id", "max_completion_tokens": "max_tokens"}


def messages_param(param: str | None) -> str | None:
    """The Messages API's name for a chat request's parameter that a refusal names."""
    if param is None:
        return None
    if param.startswith(("messages[", "messages.")):
        return "messages"  # system and tool results shift the indexes
    return _CHAT_TO_MESSAGES.get(param, param)


async def count_input_tokens(
    services: Services, principal: Principal | None, asked: CountTokensRequest, quality: str | None
) -> TokenizeResponse:
    """`/v1/messages/count_tokens`: the prompt's tokens as `/v1/tokenize` counts them (exact where the
    answering model's tokenizer is known, `approximate` otherwise), its model aliased as for a request."""
    payload = to_chat_request(asked, services.settings.server.body_limits()).wire_payload()
    alias = alias_of(services, asked.model)
    if alias is not None:
        payload["model"], quality = alias.model, quality or alias.quality
    body = TokenizeRequest.from_payload({k: payload[k] for k in CHAT_FIELDS if k in payload})
    return await count_tokens(services, principal, body, quality)


# --- the answer --------------------------------------------------------------------------------


def usage_of(usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic's usage from a chat answer's: `prompt_tokens` counts every input token, those
    read from a cache (`prompt_tokens_details.cached_tokens`) and written to one
    (`cache_creation_input_tokens`) included; Anthropic's `input_tokens` counts the rest."""
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    return {
        "input_tokens": max(0, (usage.get("prompt_tokens") or 0) - cached - written),
        "output_tokens": usage.get("completion_tokens") or 0,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }


def stop_of(choice: dict[str, Any], stop_sequences: list[str] | None) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a chat choice. A stop sequence is known to have matched when
    the backend names it: vLLM and the embedded engine give it as the choice's `stop_reason`,
    LiteLLM keeps Anthropic's `stop_sequence` in `provider_specific_fields`."""
    finish_reason = choice.get("finish_reason")
    if finish_reason is None:
        return None, None
    matched = choice.get("stop_reason")
    if not isinstance(matched, str):
        matched = (choice.get("provider_specific_fields") or {}).get("stop_sequence")
    if finish_reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return _STOP_REASONS.get(finish_reason, "end_turn"), None


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments") or ""
    try:
        tool_input = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        tool_input = {"_raw_arguments": arguments}  # the model wrote no JSON: keep what it wrote, visibly
    return {
        "type": "tool_use",
        "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
        "name": function.get("name") or "",
        "input": tool_input,
    }


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The reasoning text a backend gave beside the answer (LiteLLM and vLLM: `reasoning_content`)."""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return reasoning if isinstance(reasoning, str) and reasoning else None


def thinking_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The thinking blocks of an answer: Anthropic's own (with their signatures) when LiteLLM kept
    them, else one of the backend's reasoning text."""
    blocks = [dict(block) for block in message.get("thinking_blocks") or () if isinstance(block, dict)]
    if blocks:
        return blocks
    reasoning = reasoning_of(message)
    return [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []


def whole_message(asked: MessagesRequest, data: bytes) -> bytes:
    """A chat completion (as the upstream sent it) as a Message; `model` is the name the client
    asked for (clients such as Claude Code check it)."""
    completion = orjson.loads(data)
    choices = completion.get("choices") or [{}]
    if len(choices) != 1:
        raise SwitchyardError("The upstream answered with more than one choice to a /v1/messages request.")
    message = choices[0].get("message") or {}
    content = thinking_blocks(message)
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content += [tool_use_block(call) for call in message.get("tool_calls") or ()]
    stop_reason, stop_sequence = stop_of(choices[0], asked.stop_sequences)
    return orjson.dumps(
        {
            "id": new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": asked.model,
            "content": content,
            "stop_reason": stop_reason or "end_turn",
            "stop_sequence": stop_sequence,
            "usage": usage_of(completion.get("usage")),
        }
    )
