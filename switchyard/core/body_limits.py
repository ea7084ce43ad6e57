"""Limits on what a request body holds, beyond its size in bytes.

A body under `server.max_body_bytes` can still be costly or harmful to take in: JSON nested
deeper than a serialiser can write back (orjson stops at 254 levels), a hundred thousand tiny
messages, a prompt longer than any model reads, half a million token ids. `check_body_limits`
looks at the parsed JSON before it is validated into a wire model, cheapest checks first, and
refuses with an `InvalidRequest` that names the limit and its configuration key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchyard.core.errors import ArrayTooLong, JSONTooDeep, PromptTooLong

_CONTAINERS = (dict, list)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    max_json_depth: int
    max_messages: int
    max_prompt_chars: int
    max_prompt_token_ids: int


def too_deep_error(max_depth: int, param: str | None = None) -> JSONTooDeep:
    where = f" in '{param}'" if param is not None else ""
    return JSONTooDeep(
        f"The request body nests JSON more than {max_depth} levels deep{where}; "
        f"the limit is {max_depth} levels (server.max_json_depth).",
        param=param,
    )


def check_body_limits(payload: dict[str, Any], limits: BodyLimits) -> None:
    """Refuse a parsed body that is over a limit; fields of the wrong type are left to validation."""
    messages = payload.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise ArrayTooLong(
            f"The request has {len(messages)} messages; the limit is {limits.max_messages} (server.max_messages).",
            param="messages",
        )
    prompt, given = payload.get("prompt"), payload.get("input")  # a completion's prompt, embeddings' input
    for param, what, value in (("prompt", "The prompt", prompt), ("input", "The input", given)):
        num_ids = _num_token_ids(value)
        if num_ids > limits.max_prompt_token_ids:
            raise ArrayTooLong(
                f"{what} has {num_ids} token ids; the limit is {limits.max_prompt_token_ids} "
                "(server.max_prompt_token_ids).",
                param=param,
            )
    for param, what, num_chars in (
        ("messages", "The messages' text", _message_chars(messages)),
        ("prompt", "The prompt", _prompt_chars(prompt)),
        ("input", "The input", _prompt_chars(given)),
    ):
        if num_chars > limits.max_prompt_chars:
            raise PromptTooLong(
                f"{what} is {num_chars} characters long; the limit is {limits.max_prompt_chars} "
                "(server.max_prompt_chars).",
                param=param,
            )
    for name, value in payload.items():
        if isinstance(value, _CONTAINERS) and _is_deeper_than(value, limits.max_json_depth - 1):
            raise too_deep_error(limits.max_json_depth, name)


def _is_deeper_than(root: dict[str, Any] | list[Any], max_depth: int) -> bool:
    """Whether containers nest more than `max_depth` levels, `root` being level 1 (level by level,
    without recursion)."""
    level: list[dict[str, Any] | list[Any]] = [root]
    for _ in range(max_depth):
        below: list[dict[str, Any] | list[Any]] = []
        append = below.append
        for node in level:
            for child in node.values() if isinstance(node, dict) else node:
                if type(child) in _CONTAINERS:
                    append(child)
        if not below:
            return False
        level = below
    return True


def _num_token_ids(prompt: Any) -> int:
    """Token ids in a completions prompt: a list of ints, or a batch of such lists."""
    if not isinstance(prompt, list) or not prompt:
        return 0
    if isinstance(prompt[0], int):
        return len(prompt)
    return sum(len(item) for item in prompt if isinstance(item, list))


def _prompt_chars(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(item) for item in prompt if isinstance(item, str))
    return 0


def _message_chars(messages: Any) -> int:
    """Characters of text in chat messages: string contents, and the text of content parts."""
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    total += len(text)
    return total
