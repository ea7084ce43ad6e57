"""The versioned thresholds file: written by the evals (`switchyard eval thresholds`, `eval cascade`,
`classifier train`), read by the proxy at start. This module is its schema and its one reader.

    version: 1
    routing:                         # the auto router's thresholds
      router: classifier
      threshold: 0.2341              # route up when score >= threshold (or `thresholds: [...]`, one per tier step)
      modes: {economy: {threshold: …}, max: {threshold: …}}   # optional quality modes
      weak_model: …, strong_model: …, target: …, data: …, train: …, test: …, created: …
      by_value:                      # optional: routing among N tiers by predicted quality
        quality_models: {small: <model the artifact scores>, large: …}   # tier -> model
        tolerance: 0.05              # the balanced mode's; `modes: {economy: {tolerance: …}, …}`
      reference: {edges: […], shares: […], num_samples: 1200, rate: 0.31}   # optional, see below
    cascade:
      rungs:
        <model>: {scorer: {kind: feature, feature: first_mean_entropy, …}, threshold: -0.88, …,
                  reference: {edges: […], shares: […], num_samples: 800, rate: 0.22}}

A `reference` block (`switchyard.evals.drift_reference.reference_block`) is what the version
expects of live traffic, for the drift gauges and the report's Drift section: a histogram of the
classifier's scores (routing) or of a judged rung's confidences (a cascade rung) on the data the
thresholds were picked on, as the inner bin `edges` (ascending; bin i holds values v with
edges[i-1] <= v < edges[i]) and each bin's share of the values, and the `rate` the thresholds
predict: the share of prompts scored at or above the (balanced) threshold, the strong-call share,
for routing; the share of answers escalated (confidence below the threshold, or none) for a rung.

Sections keep any further keys the writer adds (reports, provenance); a writer replaces only its
own section.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

THRESHOLDS_VERSION = 1

# The cascade's confidence features: name -> the sign that makes "higher = more confident".
# A scorer in the thresholds file and `cascade.scorer` in the config name one of these.
CONFIDENCE_FEATURES: dict[str, float] = {
    "mean_logprob": 1.0,
    "min_logprob": 1.0,
    "p10_logprob": 1.0,
    "mean_entropy": -1.0,
    "mean_margin": 1.0,
    "first_mean_logprob": 1.0,
    "first_min_logprob": 1.0,
    "first_p10_logprob": 1.0,
    "first_mean_entropy": -1.0,
    "first_mean_margin": 1.0,
    "sum_logprob": 1.0,
    "log_length": -1.0,
}


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used; the message names the file and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ThresholdSet(_Section):
    threshold: float | None = None
    thresholds: list[float] | None = None

    def values(self) -> list[float]:
        """Ascending thresholds, one per step between tiers."""
        if self.thresholds:
            return list(self.thresholds)
        return [self.threshold] if self.threshold is not None else []


class ToleranceSet(_Section):
    tolerance: float = Field(ge=0, le=1)


class ByValueSection(ToleranceSet):
    """Routing by value (`classifier.by_value`): each tier's model as the artifact knows it, and
    how far below the best tier's predicted quality a cheaper tier may be, per quality mode. A
    reader that predates it keeps it as an unknown key and routes by the thresholds beside it."""

    quality_models: dict[str, str] = Field(default_factory=dict)
    modes: dict[str, ToleranceSet] = Field(default_factory=dict)

    def tolerances(self) -> dict[str, float]:
        return {"balanced": self.tolerance, **{mode: s.tolerance for mode, s in self.modes.items()}}


class DriftReference(_Section):
    """What live traffic is compared with (see the module's doc)."""

    edges: list[float]
    shares: list[float]
    num_samples: int = Field(ge=1)
    rate: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _bins(self) -> DriftReference:
        if len(self.shares) != len(self.edges) + 1:
            raise ValueError(f"has {len(self.edges)} edges and {len(self.shares)} shares; shares must be one more")
        if self.edges != sorted(set(self.edges)):
            raise ValueError("edges must ascend strictly")
        return self


class RoutingSection(ThresholdSet):
    router: str | None = None
    modes: dict[str, ThresholdSet] = Field(default_factory=dict)
    by_value: ByValueSection | None = None
    reference: DriftReference | None = None


class CascadeRung(_Section):
    scorer: dict[str, Any]
    threshold: float
    reference: DriftReference | None = None


class CascadeSection(_Section):
    rungs: dict[str, CascadeRung] = Field(default_factory=dict)


class ThresholdsFile(_Section):
    version: int
    routing: RoutingSection | None = None
    cascade: CascadeSection | None = None


def read_thresholds(path: str | Path) -> ThresholdsFile:
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
    try:
        return ThresholdsFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ThresholdsError(f"{path}: {where} {_plain(first['msg'])}") from None


def _plain(message: str) -> str:
    return "must be a number" if "valid number" in message else message


def write_section(path: str | Path, section: str, content: dict[str, Any], *, keep: tuple[str, ...] = ()) -> None:
    """Write `section` into the file at `path`, keeping the other sections (and the `keep` keys of
    this one: `routing.by_value` survives retraining the classifier, and the other way round)."""
    path = Path(path)
    data: dict[str, Any] = {"version": THRESHOLDS_VERSION}
    if path.exists():
        data = read_thresholds(path).model_dump(exclude_none=True)
    kept = {key: value for key, value in data.get(section, {}).items() if key in keep}
    data[section] = {**kept, **content, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def write_by_value(path: str | Path, content: dict[str, Any]) -> None:
    """Write `routing.by_value` into the file at `path`, keeping everything else in it."""
    path = Path(path)
    data: dict[str, Any] = {"version": THRESHOLDS_VERSION}
    if path.exists():
        data = read_thresholds(path).model_dump(exclude_none=True)
    routing = data.setdefault("routing", {})
    routing["by_value"] = {**content, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    ByValueSection.model_validate(routing["by_value"])  # what the proxy will read
    path.write_text(yaml.safe_dump(data, sort_keys=False))
