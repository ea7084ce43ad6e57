"""One lock for the work that imports torch, transformers, sentence-transformers and scikit-learn
lazily, off the event loop.

`switchyard serve` loads its models on several threads at once: the chat models, the `local-embed`
MiniLM, the auto router's classifier. Each imports large packages on first use, and those import
one another (sentence-transformers imports scikit-learn and transformers). Python's per-module
import locks then deadlock between two threads: it detects that and raises `ImportError: cannot
import name … from partially initialized module` in one of them, and that model never loads (seen
on a fresh install, where the first import of each module also compiles it and takes longer).
Everything that may be the first to import them holds this lock; re-entrant, as a load may
start another (a chat model's draft model).
"""

from __future__ import annotations

import threading

IMPORT_LOCK = threading.RLock()
