"""A thresholds file with `routing.by_value` stays readable by the 2026-11-22 release's reader
(e5a2206, run from git history): it routes by the thresholds beside it, or fails with a message."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from switchyard.core.thresholds import read_thresholds, write_by_value, write_section

RELEASE = "e5a2206"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def release_reader(tmp_path):
    shown = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{RELEASE}:evals/thresholds_file.py"], capture_output=True, text=True
    )
    if shown.returncode != 0:
        pytest.skip(f"the release's reader is not in this checkout's history ({RELEASE}): {shown.stderr.strip()}")
    source = tmp_path / "release_thresholds_file.py"
    source.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location("release_thresholds_file", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BY_VALUE = {"quality_models": {"small": "a", "large": "b"}, "tolerance": 0.05, "modes": {"max": {"tolerance": 0.01}}}


def test_the_release_reads_the_thresholds_beside_by_value(tmp_path, release_reader):
    path = tmp_path / "thresholds.yaml"
    write_section(path, "routing", {"router": "classifier", "threshold": 0.45, "modes": {"max": {"threshold": 0.2}}})
    write_by_value(path, BY_VALUE)
    old = release_reader.read_thresholds(path)
    assert old["version"] == 1
    assert old["routing"]["threshold"] == 0.45 and old["routing"]["modes"]["max"] == {"threshold": 0.2}
    new = read_thresholds(path).routing
    assert new is not None and new.by_value is not None
    assert new.by_value.tolerances() == {"balanced": 0.05, "max": 0.01}
    # retraining the classifier keeps routing by value, and the other way round
    write_section(path, "routing", {"router": "classifier", "threshold": 0.5}, keep=("by_value",))
    again = read_thresholds(path).routing
    assert again is not None and again.threshold == 0.5 and again.by_value is not None


def test_the_release_refuses_a_by_value_only_file_by_name(tmp_path, release_reader):
    path = tmp_path / "thresholds.yaml"
    write_by_value(path, BY_VALUE)
    with pytest.raises(release_reader.ThresholdsError, match="routing.threshold must be a number"):
        release_reader.read_thresholds(path)
