"""The embedded embedding model: all-MiniLM-L6-v2 in this process (a model of kind `embedding`).

Requests never run the model on the event loop: their inputs join a queue, and one worker thread
embeds whatever has gathered in one forward pass per length-sorted chunk (concurrent requests are
batched together), then hands each request its rows. Strings are tokenized here with the model's
own tokenizer, so the usage counts exactly the tokens the model read; token-id inputs are the
model's input ids as given. An input longer than the model reads (256 tokens) is refused, as
OpenAI refuses one over its limit, never cut silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from switchyard.backends.base import AnyRequest, Backend, BackendHealth, Pick
from switchyard.backends.embedded.minilm import EMBEDDING_DIM, MAX_TOKENS, shared_minilm
from switchyard.backends.embedded.models import shown_load_failure
from switchyard.backends.token_counts import TokenCount, run_counter
from switchyard.core.capabilities import Capabilities
from switchyard.core.chat_wire import ChatCompletionRequest, CompletionResult, StreamChunk
from switchyard.core.embeddings_wire import EmbeddingRequest, embedding_list
from switchyard.core.errors import BackendUnavailable, ContextLengthExceeded, InvalidRequest, wrong_kind
from switchyard.core.requests import GenerationRequest
from switchyard.core.urls import replica_label

logger = logging.getLogger("switchyard.engine")

CHUNK = 64  # inputs in one forward pass (sorted by length, so that padding stays small)
MAX_GATHER = 256  # inputs the worker takes from the queue at once


@dataclass(slots=True)
class _Job:
    ids: list[list[int]]
    done: asyncio.Future[np.ndarray] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class EmbeddingBackend(Backend):
    """`local-embed` in the default config. The model is loaded once per process (shared with the
    auto router's classifier, which reads the same MiniLM)."""

    starts_in_background = True

    def __init__(self, name: str, *, num_threads: int | None = None) -> None:
        self.name = name
        self.label = replica_label("embedded", 0)
        self._num_threads = num_threads
        self._model: Any = None
        self._load_error: str | None = None
        self._load_failure: str | None = None  # what /health/ready shows of it
        self._queue: list[_Job] = []
        self._worker: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"embed-{name}")

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self._model = await asyncio.get_running_loop().run_in_executor(
                self._executor, shared_minilm, self._num_threads
            )
        except Exception as exc:
            self._load_error = f"{type(exc).__name__}: {exc}"
            self._load_failure = shown_load_failure(exc)
            logger.error("model %s failed to load: %s", self.name, self._load_error)
            return
        logger.info("model %s (all-MiniLM-L6-v2) is ready", self.name)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
        for job in self._queue:
            job.done.cancel()
        self._queue.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def load_failure(self) -> str | None:
        return self._load_failure

    def is_ready(self) -> bool:
        return self._model is not None

    async def health(self) -> BackendHealth:
        if self.is_ready():
            return BackendHealth(True, f"running; {len(self._queue)} requests queued")
        return BackendHealth(False, self._load_error or "loading")

    def is_saturated(self) -> bool:
        return sum(len(job.ids) for job in self._queue) >= MAX_GATHER

    def capabilities(self) -> Capabilities:
        return Capabilities(
            tools=False,
            parallel_tool_calls=False,
            json_object=False,
            json_schema=False,
            vision=False,
            documents=False,
            logprobs=False,
            n=False,
            context_window=MAX_TOKENS,
        )

    # -- requests -------------------------------------------------------------------------------

    def _ready_model(self) -> Any:
        if self._model is None:
            detail = self._load_error or "the model is still loading"
            raise BackendUnavailable(f"{self.name} is not ready: {detail}", backend=self.name, retry_after_s=5)
        return self._model

    def _ids(self, inputs: Sequence[str | list[int]]) -> list[list[int]]:
        """Each input as the model's input ids: [CLS] … [SEP] for text, token ids as they are."""
        tokenizer = self._ready_model().tokenizer
        texts = [item for item in inputs if isinstance(item, str)]
        encoded = iter(tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else [])
        return [next(encoded) if isinstance(item, str) else list(item) for item in inputs]

    def token_ids(self, inputs: list[str | list[int]]) -> list[list[int]]:
        """Each input as the model's input ids ([CLS] … [SEP] for text), checked against what it reads."""
        ids = self._ids(inputs)
        vocab = self._ready_model().tokenizer.vocab_size
        for index, row in enumerate(ids):
            where = "input" if len(ids) == 1 else f"input[{index}]"
            if len(row) > MAX_TOKENS:
                raise ContextLengthExceeded(
                    f"{where} is {len(row)} tokens long; {self.name} reads at most {MAX_TOKENS}. "
                    "Split the text and embed the parts.",
                    param="input",
                )
            if any(not 0 <= token < vocab for token in row):
                raise InvalidRequest(f"{where} holds a token id outside {self.name}'s vocabulary (0–{vocab - 1}).")
        return ids

    async def complete(self, request: AnyRequest, pick: Pick | None = None) -> CompletionResult:
        if not isinstance(request, EmbeddingRequest):  # routing sends completions to chat models only
            raise wrong_kind(self.name, "embedding")
        if request.dimensions is not None and request.dimensions != EMBEDDING_DIM:
            raise InvalidRequest(
                f"{self.name} has {EMBEDDING_DIM} dimensions and cannot shorten them; "
                f"leave 'dimensions' out (or set it to {EMBEDDING_DIM}).",
                param="dimensions",
                code="unsupported_parameter",
            )
        inputs = request.inputs()
        self._ready_model()
        if sum(len(i) for i in inputs) > 4096:  # tokenizing a long request takes milliseconds: not on the loop
            ids = await asyncio.get_running_loop().run_in_executor(None, self.token_ids, inputs)
        else:
            ids = self.token_ids(inputs)
        vectors = await self._embed(ids)
        body = embedding_list(vectors, self.name, sum(len(row) for row in ids), request.encoding_format)
        return CompletionResult.from_dict(body, self.name)

    async def stream(self, request: AnyRequest, pick: Pick | None = None) -> AsyncIterator[StreamChunk]:
        raise wrong_kind(self.name, "embedding")
        yield  # an async generator, as the interface has it

    async def tokenize(self, request: GenerationRequest) -> TokenCount:
        """The input ids MiniLM reads for `prompt`: the `usage.prompt_tokens` of embedding it."""
        if isinstance(request, ChatCompletionRequest):
            raise InvalidRequest(
                f"'{self.name}' embeds texts and has no chat template: send 'prompt' with the input.",
                param="messages",
                code="unsupported_model",
            )
        given = request.prompt
        inputs = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else list(given)
        ids = await run_counter(lambda: self._ids(cast("list[str | list[int]]", inputs)), request)
        return TokenCount(sum(map(len, ids)), [t for row in ids for t in row], max_model_len=MAX_TOKENS)

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of MiniLM's input ids, [CLS] and [SEP] included."""
        tokenizer = self._ready_model().tokenizer
        if any(not 0 <= t < tokenizer.vocab_size for t in tokens):
            raise InvalidRequest(f"A token id is outside {self.name}'s vocabulary (0–{tokenizer.vocab_size - 1}).")
        return str(tokenizer.decode(list(tokens)))

    async def _embed(self, ids: list[list[int]]) -> np.ndarray:
        job = _Job(ids)
        self._queue.append(job)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name=f"embed:{self.name}")
        return await job.done

    async def _drain(self) -> None:
        """Embed what has gathered, until nothing waits; a cancelled request's rows are dropped."""
        loop = asyncio.get_running_loop()
        while self._queue:
            jobs: list[_Job] = []
            size = 0
            while self._queue and (not jobs or size + len(self._queue[0].ids) <= MAX_GATHER):
                job = self._queue.pop(0)
                if not job.done.done():
                    jobs.append(job)
                    size += len(job.ids)
            if not jobs:
                continue
            rows = [row for job in jobs for row in job.ids]
            try:
                vectors = await loop.run_in_executor(self._executor, self._forward, rows)
            except Exception as exc:
                logger.exception("%s failed to embed", self.name)
                error = BackendUnavailable(f"{self.name} failed to embed ({type(exc).__name__})", backend=self.name)
                for job in jobs:
                    if not job.done.done():
                        job.done.set_exception(error)
                continue
            start = 0
            for job in jobs:
                if not job.done.done():
                    job.done.set_result(vectors[start : start + len(job.ids)])
                start += len(job.ids)

    def _forward(self, rows: list[list[int]]) -> np.ndarray:
        """Normalised embeddings of `rows` (input ids), on the worker thread."""
        import torch

        model = self._model
        out = np.zeros((len(rows), EMBEDDING_DIM), dtype=np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        with torch.inference_mode():
            for start in range(0, len(order), CHUNK):
                chunk = order[start : start + CHUNK]
                width = max(len(rows[i]) for i in chunk)
                input_ids = torch.zeros((len(chunk), width), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, i in enumerate(chunk):
                    input_ids[r, : len(rows[i])] = torch.tensor(rows[i], dtype=torch.long)
                    mask[r, : len(rows[i])] = 1
                features = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(mask)}
                vectors = model.forward(features)["sentence_embedding"]
                vectors = torch.nn.functional.normalize(vectors, dim=1)
                out[chunk] = vectors.numpy()
        return out
