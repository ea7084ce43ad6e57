"""Wire schemas of `POST /v1/embeddings`, as OpenAI's reference has them.

`input` is one string, a list of strings, one list of token ids, or a list of them; the answer is a
list of `embedding` objects (floats, or base64 of little-endian float32 when `encoding_format` is
`base64`) and the usage (`prompt_tokens`, `total_tokens`). The request travels the same path as a
completion (budgets, limits, retries, metering): it has no answer tokens and never streams.
"""

from __future__ import annotations

import base64
from typing import Literal, cast

import numpy as np
from pydantic import Field, StrictInt

from switchyard.core.chat_wire import Prompt, WireRequest, _Open
from switchyard.core.errors import InvalidRequest

MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request


class EmbeddingRequest(WireRequest):
    model: str
    input: Prompt
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: str | None = None
    # never a stream; the fields the completion path reads of every request
    stream: Literal[False] | None = None

    @property
    def stream_options(self) -> None:
        return None

    def inputs(self) -> list[str | list[int]]:
        """Each input: a string, or a list of token ids; refused when empty or too many (as OpenAI does)."""
        given = self.input
        items: list[str | list[int]]
        if isinstance(given, str) or (given and isinstance(given[0], int)):
            items = [given]
        else:
            items = list(cast("list[str | list[int]]", given))
        if not items:
            raise InvalidRequest("'input' must not be empty.", param="input")
        if len(items) > MAX_INPUTS:
            raise InvalidRequest(f"'input' holds {len(items)} inputs; the limit is {MAX_INPUTS}.", param="input")
        for index, item in enumerate(items):
            if not item:
                where = "input" if len(items) == 1 else f"input[{index}]"
                raise InvalidRequest(f"'{where}' is empty: each input must hold text or token ids.", param="input")
        return items


class Embedding(_Open):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(_Open):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Open):
    """The answer of `POST /v1/embeddings` (for the API document; answers are relayed as they came)."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def as_base64(vector: np.ndarray | list[float]) -> str:
    """A vector as OpenAI's base64 encoding has it: little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def embedding_list(
    vectors: np.ndarray, model: str, prompt_tokens: int, encoding_format: str | None
) -> dict[str, object]:
    """OpenAI's answer: one `embedding` object per row of `vectors` (float32), in input order."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    data = [as_base64(row) for row in rows] if encoding_format == "base64" else rows.tolist()
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(data)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
