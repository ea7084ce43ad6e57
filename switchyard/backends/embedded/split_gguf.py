"""A model whose GGUF comes split across several data-only wheels: found, joined once into the model
cache and checked against the size and sha256 pinned here before anything reads it.

Each part is a Python package holding one slice of the file (`data/partNN.bin`). The packages are
found without being imported: their code is not ours to run, only their data is read. The join
streams the parts in order into a temporary file beside the target, hashing as it goes, and
renames it into place only when the size and sha256 are the pinned ones; a file that does not match
is deleted and the load refused, naming what was found and what was expected. Processes that start
at once (`serve --workers N`) take a file lock, so one joins and the others find the result.
The joined file's name carries the start of its sha256, and only verified bytes are ever renamed to
it, so a later start reuses it after checking its size.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from switchyard.core.file_locks import file_lock

_CHUNK_BYTES = 4 * 2**20


class SplitGgufError(ValueError):
    """The parts of a split model are missing, or do not join to the pinned file."""


@dataclass(frozen=True, slots=True)
class SplitGguf:
    model: str  # the built-in model's name, for messages
    filename: str  # the joined file's name in the model cache (before the sha256 prefix)
    parts: tuple[tuple[str, str], ...]  # (package, the file inside it), in join order
    num_bytes: int
    sha256: str

    @classmethod
    def numbered(
        cls, model: str, filename: str, package_prefix: str, num_parts: int, *, num_bytes: int, sha256: str
    ) -> SplitGguf:
        """Parts `{package_prefix}1` … `{package_prefix}{num_parts}`, each with `data/partNN.bin`."""
        parts = tuple((f"{package_prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, num_parts + 1))
        return cls(model, filename, parts, num_bytes, sha256)

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(package for package, _ in self.parts)

    def joined_path(self, cache_dir: Path) -> Path:
        stem, _, suffix = self.filename.rpartition(".")
        return cache_dir / f"{stem}-{self.sha256[:12]}.{suffix}"


def package_folder(package: str) -> Path | None:
    """The folder of an installed package, found without importing it; None if it is not installed."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def joined_gguf(split: SplitGguf, cache_dir: Path) -> Path:
    """The joined, verified GGUF in `cache_dir`: joined on the first call, reused afterwards.
    Blocking (reads and writes the whole file once): call it off the event loop."""
    target = split.joined_path(cache_dir)
    if _is_joined(target, split):
        return target
    part_files = _part_files(split)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if not _is_joined(target, split):  # another process may have joined it while we waited
            _join(split, part_files, target)
    return target


def _is_joined(target: Path, split: SplitGguf) -> bool:
    return target.is_file() and target.stat().st_size == split.num_bytes


def _part_files(split: SplitGguf) -> list[Path]:
    """Every part's file, or an error naming each missing package and file."""
    files, missing = [], []
    for package, name in split.parts:
        folder = package_folder(package)
        if folder is None:
            missing.append(package.replace("_", "-"))
        elif not (folder / name).is_file():
            missing.append(f"{name} in {folder}")
        else:
            files.append(folder / name)
    if missing:
        raise SplitGgufError(
            f"model {split.model!r} is split across {len(split.parts)} packages; missing: {', '.join(missing)} "
            f"(switchyard models install {split.model})"
        )
    total = sum(path.stat().st_size for path in files)
    if total != split.num_bytes:
        raise SplitGgufError(
            f"model {split.model!r}: its {len(files)} parts hold {total:,} bytes, not the pinned {split.num_bytes:,}; "
            f"the installed packages are not the pinned ones (switchyard models install {split.model})"
        )
    return files


def _join(split: SplitGguf, part_files: list[Path], target: Path) -> None:
    digest = hashlib.sha256()
    fd, staging_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    staging = Path(staging_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for path in part_files:
                with path.open("rb") as part:
                    while chunk := part.read(_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
        num_bytes = staging.stat().st_size
        if num_bytes != split.num_bytes or digest.hexdigest() != split.sha256:
            raise SplitGgufError(
                f"model {split.model!r}: its parts join to {num_bytes:,} bytes with sha256 {digest.hexdigest()}, "
                f"not the pinned {split.num_bytes:,} bytes with sha256 {split.sha256}; refusing to load it "
                f"(reinstall the pinned packages: switchyard models install {split.model})"
            )
        staging.rename(target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
