"""What routes `auto` and `cascade` requests, and which version of it answered.

A routing version is what the files read at start (or at a reload) make of the auto router and the
cascade: the thresholds file (`routing.thresholds_file`: the auto thresholds and the cascade's
rungs) and the classifier artifact. Its name is `v-` and the first 12 hex digits of a sha256 over
the thresholds file's bytes and the artifact's files, or `builtin-…` when every file it reads is
one Switchyard ships. With a rollout (`rollout: {candidate, candidate_artifact, share}`), a second
version, the candidate, answers the share of requests whose request id hashes below `share`.

`check_startup()` reads and checks the files (blocking I/O: a reload runs it on a thread);
`build_routings()` turns what it found into running routers. Each request keeps the `Routing` it
was decided with, so a reload never changes a request already under way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from switchyard.backends.registry import ModelRegistry
from switchyard.backends.resilience import ResilientExecutor
from switchyard.cascade.build import RungSpec, build_cascade, rung_specs
from switchyard.cascade.runtime import Cascade, Rung
from switchyard.classifier.by_value import ValueRule
from switchyard.classifier.model import ARTIFACTS, ArtifactError, ComplexityClassifier, default_artifact
from switchyard.classifier.runtime import MicroBatcher
from switchyard.core.drift import DriftMonitor
from switchyard.core.metrics import Metrics
from switchyard.core.prices import Price
from switchyard.core.settings import Settings
from switchyard.core.thresholds import ThresholdsError, ThresholdsFile, read_thresholds
from switchyard.gateway.auto_router import AutoRouter, resolve_thresholds, resolve_value_rule

logger = logging.getLogger("switchyard")

ScoreBatch = Callable[[list[str]], np.ndarray]
# The loaded classifier's embedding of texts (blocking: run it off the event loop); None until loaded.
EmbedTexts = Callable[[list[str]], np.ndarray | None]
Role = Literal["current", "candidate"]
VERSION_HEADER = "x-switchyard-routing-version"


@dataclass(frozen=True, slots=True)
class StartupCheck:
    """What the settings resolve to before anything runs: the current version's files, checked,
    and the candidate's when a rollout runs."""

    thresholds: ThresholdsFile | None
    cascade_specs: list[RungSpec]
    auto_thresholds: dict[str, list[float]] | None
    auto_value: ValueRule | None = None  # routing by value
    version: str = "builtin"
    artifact: Path | None = None  # the classifier artifact (None: no auto routing)
    artifact_sha: str | None = None  # sha256 over its files
    thresholds_path: Path | None = None
    candidate: StartupCheck | None = None
    share: float = 0.0  # the candidate's share of auto and cascade requests

    @property
    def scorer_key(self) -> tuple[str, ...] | None:
        """What a classifier is the same for: the artifact's files and what it is asked to predict."""
        if self.artifact_sha is None:
            return None
        return (self.artifact_sha, *(self.auto_value.quality_models if self.auto_value is not None else ()))


def check_startup(settings: Settings) -> StartupCheck:
    """Read the thresholds file(s) and check the cascade and auto sections (ThresholdsError if unusable)."""
    auto = settings.routing.auto
    current = _check_version(settings, settings.routing.thresholds_file, auto.classifier_artifact)
    rollout = settings.rollout
    if rollout.candidate is None or rollout.share <= 0:
        return current
    if not rollout.candidate.exists():
        logger.warning(
            "rollout.candidate %s does not exist: every request is routed by %s", rollout.candidate, current.version
        )
        return current
    try:
        candidate = _check_version(settings, rollout.candidate, rollout.candidate_artifact or auto.classifier_artifact)
    except ThresholdsError as exc:
        raise ThresholdsError(f"rollout.candidate: {exc}") from exc
    return dataclasses.replace(current, candidate=candidate, share=rollout.share)


def _check_version(settings: Settings, path: Path | None, configured_artifact: Path | None) -> StartupCheck:
    thresholds = read_thresholds(path) if path is not None else None
    try:
        specs = rung_specs(settings.cascade, thresholds)
    except ValueError as exc:
        raise ThresholdsError(str(exc)) from exc
    auto = settings.routing.auto
    auto_thresholds = value = artifact = None
    if auto.tiers:
        tolerance = {str(mode): points for mode, points in (auto.tolerance or {}).items()}
        try:
            value = resolve_value_rule(auto.tiers, auto.quality_models, tolerance, thresholds)
            artifact = configured_artifact or default_artifact(by_value=value is not None)
            if value is None:
                auto_thresholds = resolve_thresholds(auto.tiers, auto.thresholds, thresholds)
                ComplexityClassifier.read_metadata(artifact)
                if path is not None and thresholds is not None and thresholds.routing is not None:
                    _check_thresholds_fit(path, Path(artifact))
            else:  # the score's thresholds are not used; the artifact must know every tier's model
                auto_thresholds = {}
                ComplexityClassifier.check_quality_models(artifact, value.quality_models)
        except (ValueError, ArtifactError) as exc:
            raise ThresholdsError(f"routing.auto: {exc}") from exc
    artifact_sha = artifact_digest(Path(artifact)) if artifact is not None else None
    version = routing_version(path, Path(artifact) if artifact is not None else None, artifact_sha)
    return StartupCheck(thresholds, specs, auto_thresholds, value, version, artifact, artifact_sha, path)


def _check_thresholds_fit(path: Path, artifact: Path) -> None:
    """A thresholds file inside an artifact's folder holds thresholds on that artifact's scores:
    on another artifact's scores, whose scale differs, they would route wrong without a sign."""
    folder = path.parent
    if (folder / "metadata.json").is_file() and folder.resolve() != artifact.resolve():
        raise ValueError(
            f"the thresholds file {path} was picked for the classifier in {folder}, but the classifier is "
            f"{artifact}: set routing.auto.classifier_artifact to {folder}, or use {artifact}/thresholds.yaml"
        )


def artifact_digest(artifact: Path) -> str:
    """sha256 over a classifier artifact's files (their names and bytes)."""
    digest = hashlib.sha256()
    for file in sorted(file for file in artifact.rglob("*") if file.is_file()):
        digest.update(file.relative_to(artifact).as_posix().encode() + b"\0" + _read(file) + b"\0")
    return digest.hexdigest()


def routing_version(thresholds_path: Path | None, artifact: Path | None, artifact_sha: str | None) -> str:
    """`v-<12 hex>` over the thresholds file's bytes and the artifact's digest; `builtin-<12 hex>`
    when both are Switchyard's own (the shipped artifacts and their thresholds)."""
    digest = hashlib.sha256()
    read = []
    if thresholds_path is not None:
        digest.update(b"thresholds\0" + _read(thresholds_path))
        read.append(thresholds_path)
    if artifact is not None:
        digest.update(b"artifact\0" + (artifact_sha or "").encode())
        read.append(artifact)
    shipped = ARTIFACTS.resolve()
    is_builtin = all(path.resolve().is_relative_to(shipped) for path in read)
    return ("builtin-" if is_builtin else "v-") + digest.hexdigest()[:12]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ThresholdsError(f"cannot read {path}: {exc.strerror}") from exc


@dataclass(frozen=True, slots=True)
class Routing:
    """One routing version, running: what decides `auto` and `cascade` requests."""

    version: str
    role: Role
    check: StartupCheck
    auto_router: AutoRouter | None
    cascade: Cascade | None
    drift: DriftMonitor | None = None  # the drift gauges' windows, against this version's reference
    embed_texts: EmbedTexts | None = None  # its classifier's embedder (switchyard.learning)

    @property
    def thresholds(self) -> ThresholdsFile | None:
        return self.check.thresholds


@dataclass(frozen=True, slots=True)
class Routings:
    """The current version and, during a rollout, the candidate and its share of requests."""

    current: Routing
    candidate: Routing | None = None
    share: float = 0.0

    def pick(self, request_id: str) -> Routing:
        """The version that routes the request with this id: the same every time it is asked."""
        if self.candidate is not None and is_in_share(request_id, self.share):
            return self.candidate
        return self.current

    def __iter__(self) -> Iterator[Routing]:
        yield self.current
        if self.candidate is not None:
            yield self.candidate

    def scorers(self) -> list[MicroBatcher]:
        """Each running classifier once (two versions may share one)."""
        found: list[MicroBatcher] = []
        for routing in self:
            scorer = routing.auto_router.scorer if routing.auto_router is not None else None
            if scorer is not None and all(scorer is not other for other in found):
                found.append(scorer)
        return found


def is_in_share(request_id: str, share: float) -> bool:
    """Whether the request id's hash falls in the first `share` of the range (0 <= share <= 1)."""
    head = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")
    return head < share * 2**64


@dataclass(frozen=True, slots=True)
class RoutingParts:
    """What every routing version is built on: the services' own, shared by all versions."""

    settings: Settings
    registry: ModelRegistry
    prices: dict[str, Price]
    executor: ResilientExecutor
    metrics: Metrics
    score_batch: ScoreBatch | None = None  # replaces the classifier (tests)


def build_routings(parts: RoutingParts, check: StartupCheck, previous: Routings | None = None) -> Routings:
    """The running versions `check` found. A version already running in the same role in
    `previous` is kept as it is (its drift windows too); a new one keeps the classifier of a version
    in `previous` that reads the same artifact (its cache and loaded model), and every cascade
    shares the counters and thrash guard of the first one built (`Cascade.with_rungs`)."""
    running = {(r.version, r.role): r for r in previous or ()}
    reusable = {
        key: (r.auto_router.scorer, r.embed_texts)
        for r in previous or ()
        if r.auto_router is not None and r.auto_router.scorer is not None and (key := r.check.scorer_key) is not None
    }
    ladder = previous.current.cascade if previous is not None else None
    current = running.get((check.version, "current")) or _build_routing(parts, check, "current", reusable, ladder)
    candidate = None
    if check.candidate is not None:
        if current.auto_router is not None and current.auto_router.scorer is not None and check.scorer_key is not None:
            reusable[check.scorer_key] = (current.auto_router.scorer, current.embed_texts)
        candidate = running.get((check.candidate.version, "candidate")) or _build_routing(
            parts, check.candidate, "candidate", reusable, ladder or current.cascade
        )
    return Routings(current, candidate, check.share if candidate is not None else 0.0)


def _build_routing(
    parts: RoutingParts,
    check: StartupCheck,
    role: Role,
    scorers: dict[tuple[str, ...], tuple[MicroBatcher, EmbedTexts | None]],
    ladder: Cascade | None,
) -> Routing:
    drift = build_drift_monitor(parts.settings, check)
    auto_router = embed_texts = None
    if check.auto_thresholds is not None:
        key = check.scorer_key
        classifier = scorers.get(key) if key is not None else None
        scorer, embed_texts = classifier if classifier is not None else _scorer(parts, check)
        auto_router = _build_auto_router(parts, check, scorer, drift)
    cascade = None
    if check.cascade_specs:
        specs = check.cascade_specs
        if ladder is not None:
            rungs = [Rung(parts.registry.get(s.model), s.scorer, s.threshold) for s in specs]
            cascade = ladder.with_rungs(rungs, drift)
        else:
            settings = parts.settings
            cascade = build_cascade(settings.cascade, specs, parts.registry, parts.executor, parts.metrics, drift)
    return Routing(check.version, role, check, auto_router, cascade, drift, embed_texts)


def _build_auto_router(
    parts: RoutingParts, check: StartupCheck, scorer: MicroBatcher, drift: DriftMonitor | None
) -> AutoRouter:
    auto, value = parts.settings.routing.auto, check.auto_value
    assert check.auto_thresholds is not None
    return AutoRouter(
        parts.registry,
        auto.tiers,
        check.auto_thresholds,
        scorer,
        default_tier=auto.default_tier or auto.tiers[0],
        deadline_ms=auto.deadline_ms,
        prices=parts.prices,
        metrics=parts.metrics,
        read_system_prompt=auto.read_system_prompt,
        value=value,
        drift=drift,
    )


def _scorer(parts: RoutingParts, check: StartupCheck) -> tuple[MicroBatcher, EmbedTexts | None]:
    """The classifier (it loads on its worker thread at the first batch; a warm-up batch starts
    that now) and its embedder (None: a `score_batch` replaces the classifier)."""
    auto, value, artifact = parts.settings.routing.auto, check.auto_value, check.artifact
    score_batch = parts.score_batch
    embed_texts: EmbedTexts | None = None
    if score_batch is None:
        assert artifact is not None
        loaded: list[ComplexityClassifier] = []

        def score_batch(texts: list[str]) -> np.ndarray:
            if not loaded:
                loaded.append(ComplexityClassifier.load(artifact, num_threads=auto.threads))
            if value is not None:  # the score, then each tier's predicted quality
                return loaded[0].score_with_quality(texts, value.quality_models)
            return loaded[0].score(texts)

        def embed_texts(texts: list[str]) -> np.ndarray | None:
            return np.asarray(loaded[0].embedder.encode(texts), dtype=np.float32) if loaded else None

    batcher = MicroBatcher(
        score_batch, max_batch=auto.max_batch, max_wait_ms=auto.max_wait_ms, cache_size=auto.cache_size
    )
    if auto.warm_up:
        warm_up = asyncio.get_running_loop().create_task(batcher.score("warm-up", deadline_s=600))
        warm_up.add_done_callback(lambda task: task.cancelled() or task.exception())
    return batcher, embed_texts


def build_drift_monitor(settings: Settings, check: StartupCheck) -> DriftMonitor | None:
    """The drift windows of one version (None: `drift.enabled` is off, or nothing is routed)."""
    has_classifier = check.auto_thresholds is not None
    judged = [spec.model for spec in check.cascade_specs[:-1]]  # the last rung is never judged
    if not settings.drift.enabled or not (has_classifier or judged):
        return None
    balanced = (check.auto_thresholds or {}).get("balanced") or []
    return DriftMonitor.of(
        check.thresholds,
        window=settings.drift.window,
        min_samples=settings.drift.min_samples,
        psi_alert=settings.drift.psi_alert,
        classifier_threshold=balanced[0] if balanced else None,
        judged_rungs=judged,
        has_classifier=has_classifier,
    )


def retire(old: Routings, new: Routings) -> None:
    """Close each classifier of `old` that `new` does not run, once the requests it is scoring
    have their scores."""
    running = new.scorers()
    for scorer in old.scorers():
        if all(scorer is not other for other in running):
            scorer.close_when_idle()
