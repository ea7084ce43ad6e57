"""The contract: `switchyard serve --config FILE --port N` with the minimal four-key model entry."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import openai
import pytest

from tests.conftest import closed_port
from tests.helpers import PROCESS_BOUND_S, wait_until


def _switchyard(*args: str) -> list[str]:
    return [sys.executable, "-m", "switchyard", *args]


@pytest.mark.slow
def test_serve_with_the_minimal_contract_file(tmp_path, fake_upstream):
    config = tmp_path / "switchyard.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        models:
          - name: fake-small              # public model name clients send
            backend: openai               # any OpenAI-compatible HTTP server
            base_url: {fake_upstream}
            api_key: dummy                # optional
        """)
    )
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    log = tmp_path / "serve.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(
            _switchyard("serve", "--config", str(config), "--port", str(port)),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        ) as process,
    ):
        try:
            _check_serving(port, process, log)
        finally:
            process.terminate()
            process.wait(timeout=PROCESS_BOUND_S)


def _check_serving(port: int, process: subprocess.Popen, log) -> None:
    base = f"http://127.0.0.1:{port}"

    def is_live() -> bool:
        try:
            return httpx.get(base + "/health/live").status_code == 200
        except httpx.TransportError:
            return False

    assert wait_until(is_live, timeout_s=PROCESS_BOUND_S), log.read_text()
    with openai.OpenAI(base_url=base + "/v1", api_key="sk", max_retries=0) as sdk:
        reply = sdk.chat.completions.create(model="fake-small", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "alpha bravo charlie delta echo "
    assert wait_until(
        lambda: httpx.get(base + "/health/ready", timeout=30).status_code == 200, timeout_s=PROCESS_BOUND_S
    )


def test_bad_config_exits_2_naming_the_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("models:\n  - name: x\n    base_url: http://127.0.0.1:1/v1\n    colour: blue\n")
    result = subprocess.run(_switchyard("check-config", "--config", str(config)), capture_output=True, text=True)
    assert result.returncode == 2
    assert "unknown key 'models[0].colour'" in result.stderr


def test_check_config_masks_secrets(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(
        "models:\n  - name: x\n    base_url: http://127.0.0.1:1/v1\n    api_key: sk-secret-123\n"
        "auth:\n  admin_key: sk-admin-secret\n"
        "billing:\n  database_url: postgresql://me:pg-secret@127.0.0.1/db\n"
        "  redis_url: redis://:valkey-secret@127.0.0.1:6379/0\n"
    )
    result = subprocess.run(_switchyard("check-config", "--config", str(config)), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for secret in ("sk-secret-123", "sk-admin-secret", "pg-secret", "valkey-secret"):
        assert secret not in result.stdout
    assert "name: x" in result.stdout and "postgresql://me:***@127.0.0.1/db" in result.stdout


def test_check_config_refuses_credentials_in_the_url_beside_an_api_key(tmp_path):
    config = tmp_path / "both.yaml"
    config.write_text("models:\n  - name: x\n    base_url: http://alice:pw-secret@127.0.0.1:1/v1\n    api_key: sk-1\n")
    result = subprocess.run(_switchyard("check-config", "--config", str(config)), capture_output=True, text=True)
    assert result.returncode == 2
    assert "model 'x': base_url carries credentials (user:password@) and api_key is set too" in result.stderr
    assert "pw-secret" not in result.stderr + result.stdout


def test_check_config_masks_credentials_in_base_urls(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text(
        "models:\n  - name: x\n    base_url: http://alice:pw-secret@127.0.0.1:1/v1\n"
        "  - name: y\n    backend: vllm\n    replicas:\n      - base_url: http://bob:pw-other@127.0.0.1:2/v1\n"
    )
    result = subprocess.run(_switchyard("check-config", "--config", str(config)), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "pw-secret" not in result.stdout and "pw-other" not in result.stdout
    assert "http://alice:***@127.0.0.1:1/v1" in result.stdout and "http://bob:***@127.0.0.1:2/v1" in result.stdout
