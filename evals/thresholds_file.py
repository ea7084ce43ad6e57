"""The versioned thresholds file: written by `switchyard eval thresholds`, read by the proxy at start.

    version: 1
    routing:
      router: category-prior
      threshold: 0.2341          # route to the strong model when score >= threshold
      weak_model: …
      strong_model: …
      target: {quality_fraction: 0.95}   # or {max_strong_share: 0.3}
      data: {source: …, sha256: …, num_train: …, num_test: …}
      train: {strong_share, quality, pgr, cost_usd_per_1k}
      test: {strong_share, quality, pgr, cost_usd_per_1k, apgr}
      created: 2026-11-22T01:30:00+00:00

Other sections (the cascade's) sit beside `routing`; a writer replaces only its own section.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

THRESHOLDS_VERSION = 1


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used; the message names the file and the problem."""


def read_thresholds(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ThresholdsError(f"cannot read thresholds file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ThresholdsError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or "version" not in data:
        raise ThresholdsError(f"{path} is not a Switchyard thresholds file (no 'version')")
    if data["version"] != THRESHOLDS_VERSION:
        raise ThresholdsError(
            f"{path} has thresholds version {data['version']!r}; this Switchyard understands version "
            f"{THRESHOLDS_VERSION}. Re-run `switchyard eval thresholds` or upgrade."
        )
    routing = data.get("routing")
    if routing is not None and not isinstance(routing.get("threshold"), int | float):
        raise ThresholdsError(f"{path}: routing.threshold must be a number")
    return data


def write_section(path: str | Path, section: str, content: dict[str, Any]) -> None:
    """Write `section` into the file at `path`, keeping the other sections."""
    path = Path(path)
    data: dict[str, Any] = {"version": THRESHOLDS_VERSION}
    if path.exists():
        data = read_thresholds(path)
    data[section] = {**content, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
