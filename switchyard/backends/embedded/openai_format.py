"""OpenAI semantics on top of the engine's token stream: prompts, stop strings, text, logprobs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from switchyard.backends.embedded import tool_calls
from switchyard.backends.embedded.sampler import MAX_TOP_LOGPROBS, SamplingParams
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest, message_text
from switchyard.core.errors import InvalidRequest

FALLBACK_TURN_STOP = "\nUser:"
FALLBACK_TEMPLATE_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}


def chat_prompt(tokenizer, request: ChatCompletionRequest) -> str:
    """The prompt text: the model's chat template over the messages (tool calls and results in the
    history included) and, unless tool_choice is "none", the tools."""
    messages = tool_calls.hf_messages(request)
    tools = tool_calls.hf_tools(request) if tool_calls.uses_tools(request) else None
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


def chat_prompt_ids(tokenizer, request: ChatCompletionRequest) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        # The template writes the special tokens itself.
        return tokenizer.encode(chat_prompt(tokenizer, request), add_special_tokens=False)
    messages = [{"role": m.role, "content": message_text(m.content)} for m in request.messages]
    # A base model has no template: a plain transcript that ends where the assistant speaks.
    lines = [f"{FALLBACK_TEMPLATE_ROLES.get(m['role'], m['role'].title())}: {m['content']}" for m in messages]
    return tokenizer.encode("\n".join(lines) + "\nAssistant:")


def response_schema(request: ChatCompletionRequest) -> tuple[bool, dict[str, Any] | None]:
    """(JSON asked for, its schema): `response_format` json_object is any object, json_schema its schema."""
    response_format = request.response_format or {}
    kind = response_format.get("type")
    if kind == "json_object":
        return True, None
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format json_schema needs json_schema.schema.", param="response_format")
        return True, schema
    return False, None


def completion_prompt_ids(tokenizer, request: CompletionRequest) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    token_ids = [t for t in prompt if isinstance(t, int)]
    if prompt and len(token_ids) == len(prompt):
        return token_ids
    raise InvalidRequest("The embedded engine takes one prompt per request.", param="prompt")


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest,
    num_prompt_tokens: int,
    context_window: int,
    default_max_tokens: int,
) -> SamplingParams:
    if (request.n or 1) > 1:
        raise InvalidRequest("The embedded engine generates one choice per request (n=1).", param="n")
    if isinstance(request, ChatCompletionRequest):
        max_tokens = request.max_completion_tokens or request.max_tokens
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else 0
        if request.top_logprobs and not request.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
    else:
        max_tokens = request.max_tokens
        top_logprobs = request.logprobs or 0
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, context_window - num_prompt_tokens))
    stop = request.stop if isinstance(request.stop, list) else ([request.stop] if request.stop else [])
    if len(stop) > 4:
        raise InvalidRequest("Up to 4 stop sequences are allowed.", param="stop")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        seed=request.seed,
        stop=tuple(s for s in stop if s),
        top_logprobs=min(top_logprobs, MAX_TOP_LOGPROBS),
    )


@dataclass
class TextAssembler:
    """Turns token ids into text deltas, holding back incomplete characters and possible stop strings."""

    tokenizer: Any
    stop: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    emitted: str = ""
    is_stopped: bool = False

    def add(self, token_id: int) -> str:
        """Append a token; return the text that may now be shown (may be empty)."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        found = [at for stop in self.stop if (at := text.find(stop, max(0, len(self.emitted) - len(stop) + 1))) >= 0]
        if found:
            text, self.is_stopped = text[: min(found)], True
        else:
            text = text[: len(text) - self._held_back(text)]
        delta = text[len(self.emitted) :]
        self.emitted = text if len(text) >= len(self.emitted) else self.emitted
        return delta

    def _held_back(self, text: str) -> int:
        """Length of the longest end of `text` that could still grow into a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def flush(self) -> str:
        """At the end of generation: whatever was held back for a stop string that never came."""
        if self.is_stopped:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd")
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprob_entry(tokenizer, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
    text = token_text(tokenizer, token_id)
    return {
        "token": text,
        "logprob": logprob,
        "bytes": list(text.encode()),
        "top_logprobs": [
            {"token": (t := token_text(tokenizer, tid)), "logprob": lp, "bytes": list(t.encode())} for tid, lp in top
        ],
    }


def completion_logprobs(tokenizer, steps: list[tuple[int, float, list[tuple[int, float]]]], start: int) -> dict:
    tokens, offsets, offset = [], [], start
    for token_id, _, _ in steps:
        tokens.append(token_text(tokenizer, token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    return {
        "tokens": tokens,
        "token_logprobs": [lp for _, lp, _ in steps],
        "top_logprobs": [{token_text(tokenizer, tid): lp for tid, lp in top} for _, _, top in steps],
        "text_offset": offsets,
    }


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` (the prompt tokens whose KV came
    from the prefix cache, counted among `prompt_tokens`) only when some did."""
    counts: dict[str, Any] = {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
    if num_cached_tokens > 0:
        counts["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
    return counts


def now() -> int:
    return int(time.time())
