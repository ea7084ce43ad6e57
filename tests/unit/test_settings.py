from __future__ import annotations

import pytest

from proxy.settings import ConfigError, load_settings

MINIMAL = """\
models:
  - name: fake-small
    backend: openai
    base_url: http://127.0.0.1:9100/v1
    api_key: dummy
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("SWITCHYARD__"):
            monkeypatch.delenv(key)


def _write(tmp_path, text: str):
    path = tmp_path / "switchyard.yaml"
    path.write_text(text)
    return path


def test_minimal_contract_file_loads(tmp_path):
    settings = load_settings(_write(tmp_path, MINIMAL))
    [model] = settings.models
    assert model.name == "fake-small"
    assert model.backend == "openai"
    assert model.api_key.get_secret_value() == "dummy"
    assert "dummy" not in repr(model)
    assert [r.base_url for r in model.replica_list()] == ["http://127.0.0.1:9100/v1"]


def test_no_file_uses_the_built_in_default():
    settings = load_settings(None)
    assert settings.server.port == 8080


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD__SERVER__PORT", "9321")
    monkeypatch.setenv("SWITCHYARD__UPSTREAM__READ_TIMEOUT_S", "12.5")
    settings = load_settings(_write(tmp_path, MINIMAL + "server:\n  port: 1234\n"))
    assert settings.server.port == 9321
    assert settings.upstream.read_timeout_s == 12.5
    assert settings.models[0].name == "fake-small"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL + "    colour: blue\n", "unknown key 'models[0].colour'"),
        (MINIMAL + "srever:\n  port: 1\n", "unknown key 'srever'"),
        (MINIMAL + "server:\n  prot: 1\n", "unknown key 'server.prot'"),
        ("models:\n  - name: a\n", "models[0]: Value error, give exactly one of 'base_url' or 'replicas'"),
        (MINIMAL + MINIMAL.split("\n", 1)[1], "model name 'fake-small' is listed twice"),
        ("models: [\n", "is not valid YAML"),
        ("- just\n- a list\n", "must hold a mapping"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, text, expected):
    with pytest.raises(ConfigError) as info:
        load_settings(_write(tmp_path, text))
    assert expected in str(info.value)


def test_unknown_environment_key_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("SWITCHYARD__SERVER__PROT", "1")
    with pytest.raises(ConfigError, match="prot"):
        load_settings(_write(tmp_path, MINIMAL))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.yaml")


def test_replicas(tmp_path):
    text = """\
models:
  - name: big
    replicas:
      - base_url: http://127.0.0.1:9001/v1
      - base_url: http://127.0.0.1:9002/v1
        api_key: k2
"""
    [model] = load_settings(_write(tmp_path, text)).models
    assert [r.base_url for r in model.replica_list()] == [
        "http://127.0.0.1:9001/v1",
        "http://127.0.0.1:9002/v1",
    ]
