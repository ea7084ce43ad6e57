"""Promoting a rollout's candidate, and rolling back, on the files the proxy reads.

`promote`: the candidate thresholds file (`rollout.candidate`) becomes `routing.thresholds_file`,
whose old content is kept beside it as `<file>.previous`; with `rollout.candidate_artifact`, the
candidate artifact becomes `routing.auto.classifier_artifact` the same way. The candidate file is
gone afterwards, so the rollout's share goes back to nothing until a new candidate is written.

`rollback`: a candidate still in rollout is withdrawn (kept as `<candidate>.withdrawn`); with none,
the last promotion is undone (`<file>.previous` back in place, the demoted one kept as
`<file>.rolled-back`). Each move is a rename on the same filesystem; a running proxy sees the
result at its next reload.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from switchyard.classifier.model import ARTIFACTS
from switchyard.core.settings import RolloutSettings, Settings
from switchyard.core.thresholds import ThresholdsError
from switchyard.gateway.routings import check_startup


class RolloutError(ValueError):
    """A promotion or rollback that cannot be done; the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class Moved:
    """What a promotion or rollback did, one line a move, for its caller to print."""

    lines: list[str]


def promote(settings: Settings) -> Moved:
    rollout = settings.rollout
    thresholds = _own_thresholds_file(settings, "promote")
    candidate = rollout.candidate
    if candidate is None:
        raise RolloutError("no rollout.candidate in the config: nothing to promote")
    if not candidate.is_file():
        raise RolloutError(
            f"rollout.candidate {candidate} does not exist: nothing to promote "
            f"(write one with `switchyard eval retune --out {candidate}`)"
        )
    artifact = rollout.candidate_artifact
    current_artifact = settings.routing.auto.classifier_artifact
    if artifact is not None:
        if not artifact.is_dir():
            raise RolloutError(f"rollout.candidate_artifact {artifact} is not a folder")
        if current_artifact is None or _is_shipped(current_artifact):
            raise RolloutError(
                "rollout.candidate_artifact needs routing.auto.classifier_artifact set to a folder of your own, "
                "for the candidate to take its place"
            )
    promoted = settings.model_copy(deep=True)
    promoted.routing.thresholds_file = candidate
    if artifact is not None:
        promoted.routing.auto.classifier_artifact = artifact
    promoted.rollout = RolloutSettings()  # checked as the proxy will read it: no candidate
    try:
        check_startup(promoted)  # the proxy would refuse it at its reload: refuse it now
    except ThresholdsError as exc:
        raise RolloutError(f"the candidate cannot be promoted: {exc}") from exc
    lines = [*_replace(candidate, thresholds)]
    if artifact is not None:
        assert current_artifact is not None
        lines += _replace(artifact, current_artifact)
    elif current_artifact is not None and _backup(current_artifact).exists():
        _remove(_backup(current_artifact))  # the promotion before this one's: a rollback undoes only this one
    lines.append("no candidate left: every auto and cascade request is routed by the promoted version")
    return Moved(lines)


def rollback(settings: Settings) -> Moved:
    candidate = settings.rollout.candidate
    if candidate is not None and candidate.is_file():
        withdrawn = candidate.with_name(candidate.name + ".withdrawn")
        candidate.replace(withdrawn)
        kept = f"withdrew the candidate {candidate} (kept as {withdrawn})"
        return Moved([kept, "every request is routed by the current version"])
    thresholds = _own_thresholds_file(settings, "roll back")
    previous = _backup(thresholds)
    if not previous.is_file():
        raise RolloutError(f"nothing to roll back: no candidate in rollout and no {previous} from a promotion")
    lines = [*_restore(previous, thresholds)]
    artifact = settings.routing.auto.classifier_artifact
    if artifact is not None and _backup(artifact).is_dir():
        lines += _restore(_backup(artifact), artifact)
    return Moved(lines)


def _own_thresholds_file(settings: Settings, doing: str) -> Path:
    path = settings.routing.thresholds_file
    if path is None:
        raise RolloutError(f"routing.thresholds_file is not set: set it to the file the proxy reads, to {doing}")
    if _is_shipped(path):
        raise RolloutError(
            f"routing.thresholds_file is {path}, shipped with Switchyard: set it to a file of your own to {doing}"
        )
    return path


def _is_shipped(path: Path) -> bool:
    return path.resolve().is_relative_to(ARTIFACTS.resolve())


def _backup(path: Path) -> Path:
    return path.with_name(path.name + ".previous")


def _replace(new: Path, current: Path) -> list[str]:
    """`new` in `current`'s place, the old `current` kept as its backup."""
    lines = []
    if current.exists():
        backup = _backup(current)
        _remove(backup)
        current.replace(backup)
        lines.append(f"kept {current} as {backup}")
    new.replace(current)
    lines.append(f"promoted {new} to {current}")
    return lines


def _restore(backup: Path, current: Path) -> list[str]:
    demoted = current.with_name(current.name + ".rolled-back")
    lines = []
    if current.exists():
        _remove(demoted)
        current.replace(demoted)
        lines.append(f"kept {current} as {demoted}")
    backup.replace(current)
    lines.append(f"restored {current} from {backup}")
    return lines


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
