"""The wheel installs one import name, `switchyard`, and leaves names like `evals` to the user."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["core", "billing", "backends", "classifier", "cascade", "proxy", "evals"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    [built] = out.glob("switchyard_llm-*.whl")
    return built


def test_every_package_and_data_file_is_under_switchyard(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if not n.startswith("switchyard_llm-")]
    assert code and all(n.startswith("switchyard/") for n in code), [n for n in code if not n.startswith("switchyard/")]
    for folder in FOLDERS:
        for source in (ROOT / folder).rglob("*.py"):
            if "data" in source.relative_to(ROOT).parts:
                continue
            assert f"switchyard/{source.relative_to(ROOT).as_posix()}" in names
    assert "switchyard/classifier/artifacts/static-logreg/model.joblib" in names
    assert "switchyard/evals/data/routellm/gsm8k_test.jsonl.gz" in names
    assert (
        "switchyard/evals/data/vicuna80/graded.jsonl.gz" in names and "switchyard/evals/data/vicuna80/LICENSE" in names
    )
    assert "switchyard/cli.py" in names


def test_installed_next_to_a_package_called_evals(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    work = tmp_path / "project"  # a user's own folder, as ML repositories often have
    (work / "evals").mkdir(parents=True)
    (work / "evals" / "__init__.py").write_text("OWNER = 'the user'\n")
    script = (
        "import evals, switchyard, switchyard.core.prices as prices\n"
        "assert evals.OWNER == 'the user'\n"
        "assert prices.Price(1, 2).cost_usd(10**6, 0) == 1\n"
        "import importlib.util\n"
        "for name in ('proxy', 'backends', 'cascade', 'classifier', 'billing', 'core'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        "print(switchyard.__version__)\n"
    )
    done = subprocess.run([python, "-c", script], cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.1.0"
    refused = subprocess.run([python, "-c", "import proxy"], cwd=work, capture_output=True, text=True)
    assert "No module named 'proxy'" in refused.stderr
