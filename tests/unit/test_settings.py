from __future__ import annotations

import pytest

from switchyard.backends.defaults import load_settings
from switchyard.core.settings import ConfigError

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
    from switchyard.backends.defaults import DEFAULT_THRESHOLDS, LARGE_MODELS
    from switchyard.backends.embedded.models import is_installed

    settings = load_settings(None)
    small, large, embed = settings.models
    assert (embed.name, embed.kind, embed.model, embed.tier) == ("local-embed", "embedding", "all-minilm-l6-v2", None)
    assert (small.name, small.backend, small.model, small.tier) == ("local-small", "embedded", "smollm2-135m", "small")
    assert (large.name, large.backend, large.tier) == ("local-large", "embedded", "large")
    assert large.model == next((name for name in LARGE_MODELS if is_installed(name)), "smollm2-135m")
    assert large.engine.num_blocks == 512 and small.engine.num_blocks == 256  # defaults fill what is not given
    assert small.price.to_price().cost_usd(10**6, 0) == 0.01
    assert settings.routing.auto.tiers == ["small", "large"]
    assert settings.routing.thresholds_file == DEFAULT_THRESHOLDS and DEFAULT_THRESHOLDS.is_file()
    assert settings.cascade.ladder == (["local-small", "local-large"] if large.model != "smollm2-135m" else [])


@pytest.mark.parametrize("installed", [("qwen2.5-coder-0.5b",), ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")])
def test_the_default_local_large_is_the_largest_opt_in_model_installed(installed, tmp_path, monkeypatch):
    from switchyard.backends.embedded.models import BUILTIN_MODELS, is_installed

    if installed == ("qwen2.5-coder-0.5b",) and is_installed("qwen2.5-coder-1.5b"):
        pytest.skip("the real qwen2.5-coder-1.5b is installed, so the default picks it")
    for model in installed:  # its part packages, findable (the default config never reads them)
        for package in BUILTIN_MODELS[model][0]:
            (tmp_path / package).mkdir()
            (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = load_settings(None)
    large = next(m for m in settings.models if m.name == "local-large")
    assert large.model == installed[-1]
    assert settings.cascade.ladder == ["local-small", "local-large"]


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
        ("models:\n  - {name: a, backend: litellm}\n", "models[0].litellm_model: Field required"),
        ("models:\n  - {name: a, backend: embedded}\n", "models[0].model: Field required"),
        (
            "models:\n  - {name: a, backend: litellm, litellm_model: x/y, replicas: []}\n",
            "unknown key 'models[0].replicas' (backend 'litellm' does not take it)",
        ),
        (
            "models:\n  - {name: a, backend: openai, base_url: http://h, engine: {}}\n",
            "unknown key 'models[0].engine' (backend 'openai' does not take it)",
        ),
        ("models:\n  - {name: a, backend: tgi}\n", "models[0].backend: must be one of openai, vllm, litellm, embedded"),
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


def test_more_than_one_worker_needs_valkey(tmp_path, monkeypatch):
    """A URL, or none given (a private Valkey); `redis_url: none` is refused."""
    off = "billing:\n  redis_url: none\n"
    with pytest.raises(ConfigError, match=r"server\.workers: 2 needs Valkey: budgets, rate limits"):
        load_settings(_write(tmp_path, MINIMAL + "server:\n  workers: 2\n" + off))
    settings = load_settings(_write(tmp_path, MINIMAL + "server:\n  workers: 2\nbilling:\n  redis_url: redis://h/0\n"))
    assert settings.server.workers == 2
    assert load_settings(_write(tmp_path, MINIMAL + "server:\n  workers: 2\n")).server.workers == 2
    assert load_settings(_write(tmp_path, MINIMAL + off)).server.workers == 1
    monkeypatch.setenv("SWITCHYARD__SERVER__WORKERS", "3")  # the environment names it too
    with pytest.raises(ConfigError, match=r"server\.workers: 3 needs Valkey"):
        load_settings(_write(tmp_path, MINIMAL + off))
