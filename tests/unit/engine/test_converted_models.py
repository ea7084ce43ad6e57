"""A converted GGUF model is moved into place once, even when two worker processes convert it at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.backends.embedded.models import publish_converted


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
