"""How the Valkey cache store writes what it keeps: key parts, an entry's bytes, a context's vectors.

An entry is one value: a fixed head (`ANSWER_HEAD`: format version, token counts, cost, time, the
lengths of the strings), the model, deployment and prompt text (UTF-8), then the answer's JSON as
the upstream gave it. A context's vectors are one value: `HEADER` (an 8-byte nonce, new whenever
the value is written afresh, and the dimension), then one record per entry put: its 16-byte id and
its float32 vector, little-endian. An id is the BLAKE2b digest of the caller's key.
"""

from __future__ import annotations

import hashlib
import struct
from urllib.parse import quote

import numpy as np

from switchyard.cache.entries import CachedAnswer

ID_BYTES = 16
HEADER = struct.Struct("<8sI4x")  # nonce, dimension
ANSWER_HEAD = struct.Struct("<BIIddHHI")  # version, tokens in/out, cost, created, len model/deployment/prompt
NO_PROMPT = 0xFFFFFFFF
FORMAT_VERSION = 1


def escape_scope(scope: str) -> str:
    """The scope as it appears in key names: percent-escaped, so no `:`, `*`, `?`, `[` or `]`."""
    return quote(scope, safe="")


def digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=ID_BYTES).digest()


def encode_answer(answer: CachedAnswer) -> bytes:
    model, deployment = answer.model.encode(), answer.deployment.encode()
    prompt = b"" if answer.prompt_text is None else answer.prompt_text.encode()
    head = ANSWER_HEAD.pack(
        FORMAT_VERSION,
        answer.prompt_tokens,
        answer.completion_tokens,
        answer.cost_usd,
        answer.created_at,
        len(model),
        len(deployment),
        NO_PROMPT if answer.prompt_text is None else len(prompt),
    )
    return b"".join((head, model, deployment, prompt, answer.body))


def decode_answer(data: bytes | str | None) -> CachedAnswer | None:
    """The answer, or None for none or bytes in another format (written by another version: a miss)."""
    if not isinstance(data, bytes) or len(data) < ANSWER_HEAD.size or data[0] != FORMAT_VERSION:
        return None
    _, prompt_tokens, completion_tokens, cost_usd, created_at, n_model, n_deployment, n_prompt = (
        ANSWER_HEAD.unpack_from(data)
    )
    at = ANSWER_HEAD.size
    model = data[at : at + n_model].decode()
    at += n_model
    deployment = data[at : at + n_deployment].decode()
    at += n_deployment
    prompt_text = None
    if n_prompt != NO_PROMPT:
        prompt_text = data[at : at + n_prompt].decode()
        at += n_prompt
    return CachedAnswer(
        body=data[at:],
        model=model,
        deployment=deployment,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=cost_usd,
        created_at=created_at,
        prompt_text=prompt_text,
    )


def as_bytes(value: bytes | str | None) -> bytes:
    """A value read from Valkey (this client does not decode), or b"" for none."""
    return value if isinstance(value, bytes) else b""


def as_vector(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype="<f4").reshape(-1)


def parse_records(data: bytes, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of the records in `data`; the vectors contiguous (a strided matrix makes the
    product several times slower)."""
    record = np.dtype([("id", np.uint8, (ID_BYTES,)), ("vector", "<f4", (dimension,))])
    rows = np.frombuffer(data, dtype=record, count=len(data) // record.itemsize)
    return rows["id"], np.ascontiguousarray(rows["vector"])
