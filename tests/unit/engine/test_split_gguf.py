"""A model split across part packages: found without importing them, joined once into the cache,
refused unless the joined bytes are the pinned ones. Fake part packages are built in tmp_path."""

from __future__ import annotations

import hashlib
import importlib
import re
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import pytest

from switchyard.backends.embedded import models
from switchyard.backends.embedded.packages import MODEL_PACKAGES
from switchyard.backends.embedded.split_gguf import SplitGguf, SplitGgufError, joined_gguf

PART_BYTES = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail" * 100]


def _install_parts(site: Path, prefix: str, contents: list[bytes]) -> None:
    """Part packages `{prefix}1`… with `data/partNN.bin`, whose code fails if anyone imports it."""
    for i, data in enumerate(contents, start=1):
        folder = site / f"{prefix}{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise RuntimeError('a part package must not be imported')\n")
        (folder / "data" / f"part{i:02d}.bin").write_bytes(data)


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def prefix() -> str:
    return f"fake_parts_{uuid.uuid4().hex[:8]}_part"  # a name no earlier test has made the importer cache


def _split(prefix: str, contents: list[bytes] = PART_BYTES) -> SplitGguf:
    whole = b"".join(contents)
    return SplitGguf.numbered(
        "fake-model", "fake.gguf", prefix, len(contents), num_bytes=len(whole), sha256=hashlib.sha256(whole).hexdigest()
    )


def test_the_parts_are_joined_in_order_once_and_reused(site, prefix, tmp_path):
    _install_parts(site, prefix, PART_BYTES)
    split, cache = _split(prefix), tmp_path / "cache"
    path = joined_gguf(split, cache)
    assert path.read_bytes() == b"".join(PART_BYTES)
    assert path.parent == cache and split.sha256[:12] in path.name
    assert not any(name.startswith(prefix) for name in sys.modules)  # read, never imported
    first_write = path.stat().st_mtime_ns
    for part in site.glob(f"{prefix}*/data/*.bin"):  # the second call does not read the parts again
        part.unlink()
    assert joined_gguf(split, cache) == path
    assert path.stat().st_mtime_ns == first_write
    assert [p.name for p in cache.iterdir() if p.suffix != ".lock"] == [path.name]


def test_two_threads_joining_at_once_both_get_the_one_file(site, prefix, tmp_path):
    _install_parts(site, prefix, PART_BYTES)
    split, cache = _split(prefix), tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: joined_gguf(split, cache), range(2)))
    assert paths[0] == paths[1] and paths[0].read_bytes() == b"".join(PART_BYTES)
    assert [p.name for p in cache.iterdir() if p.suffix != ".lock"] == [paths[0].name]  # no staging left


def test_a_missing_part_package_is_named_with_the_install_command(site, prefix, tmp_path):
    _install_parts(site, prefix, PART_BYTES[:2])
    with pytest.raises(SplitGgufError) as caught:
        joined_gguf(_split(prefix), tmp_path / "cache")
    message = str(caught.value)
    assert f"missing: {prefix.replace('_', '-')}3 " in message
    assert "switchyard models install fake-model" in message
    assert not (tmp_path / "cache").exists()


def test_a_part_package_without_its_data_file_is_named(site, prefix, tmp_path):
    _install_parts(site, prefix, PART_BYTES)
    (site / f"{prefix}2" / "data" / "part02.bin").unlink()
    with pytest.raises(SplitGgufError, match=rf"missing: data/part02\.bin in .*{prefix}2"):
        joined_gguf(_split(prefix), tmp_path / "cache")


def test_parts_of_the_wrong_size_are_refused_before_joining(site, prefix, tmp_path):
    _install_parts(site, prefix, [PART_BYTES[0], PART_BYTES[1][:-1], PART_BYTES[2]])
    split = _split(prefix)
    with pytest.raises(SplitGgufError) as caught:
        joined_gguf(split, tmp_path / "cache")
    expected = len(b"".join(PART_BYTES))
    assert f"hold {expected - 1:,} bytes, not the pinned {expected:,}" in str(caught.value)
    assert not (tmp_path / "cache").exists()


def test_parts_with_the_wrong_bytes_are_refused_and_nothing_is_kept(site, prefix, tmp_path):
    tampered = bytearray(PART_BYTES[1])
    tampered[100] ^= 1
    _install_parts(site, prefix, [PART_BYTES[0], bytes(tampered), PART_BYTES[2]])
    split, cache = _split(prefix), tmp_path / "cache"
    with pytest.raises(SplitGgufError) as caught:
        joined_gguf(split, cache)
    found = hashlib.sha256(PART_BYTES[0] + bytes(tampered) + PART_BYTES[2]).hexdigest()
    message = str(caught.value)
    assert f"sha256 {found}" in message
    assert f"the pinned {split.num_bytes:,} bytes with sha256 {split.sha256}" in message
    assert "refusing to load it" in message
    assert [p.name for p in cache.iterdir() if p.suffix != ".lock"] == []  # neither the file nor its staging copy


def test_a_built_in_split_model_is_found_by_its_packages_and_checked_against_its_pins(site, tmp_path):
    split = models.QWEN_CODER_0_5B
    for package, data_file in split.parts:  # found before any real ones: `site` is first on sys.path
        (site / package / "data").mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (site / package / data_file).write_bytes(b"not a model")
    assert models.is_installed(split.model)
    with pytest.raises(SplitGgufError, match=r"its 6 parts hold 66 bytes, not the pinned 491,400,064"):
        models.resolve_model(split.model, tmp_path / "cache")
    (site / split.packages[-1] / "__init__.py").unlink()
    (site / split.packages[-1] / split.parts[-1][1]).unlink()
    (site / split.packages[-1] / "data").rmdir()
    (site / split.packages[-1]).rmdir()
    importlib.invalidate_caches()
    if models.package_folder(split.packages[-1]) is None:  # unless the real part is installed too
        assert not models.is_installed(split.model)


@pytest.mark.parametrize("split", [models.QWEN_CODER_0_5B, models.QWEN_CODER_1_5B], ids=lambda s: s.model)
def test_the_pinned_wheels_are_the_parts_in_join_order(split):
    entry = MODEL_PACKAGES[split.model]
    names = [re.match(r"([\w-]+)==", line).group(1).replace("-", "_") for line in entry.requirements]
    assert tuple(names) == split.packages
    assert all(re.search(r" --hash=sha256:[0-9a-f]{64}$", line) for line in entry.requirements)
    assert entry.model_sha256 == split.sha256 and entry.licence == "Apache-2.0" and not entry.default


def test_the_apache_licence_and_the_notice_of_origin_ship_with_the_package():
    notices = resources.files("switchyard.backends.embedded") / "notices" / "qwen2.5-coder"
    assert "Apache License" in (notices / "LICENSE").read_text() and "Version 2.0" in (notices / "LICENSE").read_text()
    notice = (notices / "NOTICE").read_text()
    for split in (models.QWEN_CODER_0_5B, models.QWEN_CODER_1_5B):
        assert split.sha256 in notice and f"{split.num_bytes:,}" in notice
        for line in MODEL_PACKAGES[split.model].requirements:
            assert line.rsplit(":", 1)[1] in notice
