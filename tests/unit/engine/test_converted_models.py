"""A converted GGUF model is moved into place once, even when two worker processes convert it at once,
and found again by its content wherever the GGUF lies (a venv per clone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchyard.backends.embedded.models import converted_dir, converted_model, publish_converted


def _conversion(folder: Path, marker: str) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_text(marker)
    return folder


def test_the_first_conversion_is_moved_into_place(tmp_path: Path) -> None:
    target = tmp_path / "model-abc"
    publish_converted(_conversion(tmp_path / "model-abc.1", "first"), target)
    assert (target / "model.safetensors").read_text() == "first"


def test_a_second_conversion_finding_the_first_in_place_drops_its_copy(tmp_path: Path) -> None:
    target = tmp_path / "model-abc"
    publish_converted(_conversion(tmp_path / "model-abc.1", "first"), target)
    publish_converted(_conversion(tmp_path / "model-abc.2", "second"), target)
    assert (target / "model.safetensors").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-abc"]


def test_a_failed_move_with_no_conversion_in_place_is_an_error(tmp_path: Path) -> None:
    staging = _conversion(tmp_path / "model-abc.1", "first")
    with pytest.raises(OSError):
        publish_converted(staging, tmp_path / "missing-folder" / "model-abc")
    assert not staging.exists()


def _gguf(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_copies_of_one_gguf_in_two_places_share_one_converted_folder(tmp_path: Path) -> None:
    first = _gguf(tmp_path / "venv-a" / "model.gguf", b"GGUF" + bytes(3 << 20))
    second = _gguf(tmp_path / "venv-b" / "model.gguf", b"GGUF" + bytes(3 << 20))
    os.utime(second, ns=(1, 1))  # another install: another path and time, the same bytes
    cache = tmp_path / "cache"
    assert converted_dir(first, cache) == converted_dir(second, cache)
    assert converted_dir(first, cache).name.startswith("model-")


def test_a_gguf_with_other_bytes_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    gguf = _gguf(tmp_path / "model.gguf", b"GGUF" + bytes(1 << 20))
    before = converted_dir(gguf, cache)
    _gguf(tmp_path / "model.gguf", b"GGUF" + bytes(1 << 20) + b"\x01")  # rewritten in place
    assert converted_dir(gguf, cache) != before


def test_a_converted_folder_in_place_is_used_without_converting(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path / "model.gguf", b"not a model: converting it would fail")
    folder = converted_dir(gguf, tmp_path / "cache")
    folder.parent.mkdir()
    _conversion(folder, "done")
    assert converted_model(gguf, tmp_path / "cache") == (folder, False)
