"""The static embedding table is built by one process at a time: a process that waited for another
one's build reads its table instead of building its own (`serve --workers N` on a fresh machine)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

from switchyard.classifier import embedder as embedder_module
from switchyard.classifier.embedder import EMBEDDING_DIM, StaticEmbedder
from switchyard.core.file_locks import file_lock


class _Tokenizer:
    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "##b": 1}


def test_a_builder_that_waited_for_the_lock_reads_the_table_built_meanwhile(tmp_path, monkeypatch):
    def never_build(num_threads):
        raise AssertionError("built a second time")

    monkeypatch.setattr(embedder_module, "_load_minilm", never_build)
    at_the_lock = threading.Event()
    real_lock = embedder_module.file_lock

    @contextlib.contextmanager
    def announced_lock(path):
        at_the_lock.set()
        with real_lock(path):
            yield

    monkeypatch.setattr(embedder_module, "file_lock", announced_lock)
    static = StaticEmbedder(cache_dir=tmp_path)
    table_path = tmp_path / StaticEmbedder.TABLE_FILE
    built_meanwhile = np.random.default_rng(0).random((2, EMBEDDING_DIM), dtype=np.float32)
    results: list[np.ndarray] = []
    with file_lock(table_path.with_suffix(".lock")):  # another process is building
        waiter = threading.Thread(target=lambda: results.append(static._read_or_build(_Tokenizer())))
        waiter.start()
        assert at_the_lock.wait(timeout=30)  # it found no table and waits for the builder
        np.save(table_path, built_meanwhile)
    waiter.join(timeout=30)
    assert not waiter.is_alive() and len(results) == 1
    assert np.array_equal(results[0], built_meanwhile)


def test_a_table_already_there_is_read_without_the_lock(tmp_path, monkeypatch):
    table = np.ones((2, EMBEDDING_DIM), dtype=np.float32)
    np.save(tmp_path / StaticEmbedder.TABLE_FILE, table)
    monkeypatch.setattr(embedder_module, "file_lock", pytest.fail)
    assert np.array_equal(StaticEmbedder(cache_dir=tmp_path)._read_or_build(_Tokenizer()), table)
