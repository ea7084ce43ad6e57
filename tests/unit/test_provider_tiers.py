"""The built-in default config with provider keys in the environment (backends/provider_tiers.py)."""

from __future__ import annotations

import pytest

from switchyard.backends import defaults
from switchyard.backends.defaults import default_config, describe_default_tiers, load_settings
from switchyard.backends.provider_tiers import PROVIDERS
from switchyard.core.settings import parse_settings

LOCAL = ["local-small", "local-large", "local-embed"]


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch):
    """The environment as the test run has it (conftest takes the keys out), without SWITCHYARD__ overrides."""
    import os

    for name in list(os.environ):
        if name.startswith("SWITCHYARD__"):
            monkeypatch.delenv(name)


def _names(config) -> list[str]:
    return [model["name"] for model in config["models"]]


def test_without_a_key_the_default_is_the_local_one(monkeypatch):
    without = default_config()
    assert _names(without) == LOCAL
    assert without["routing"]["auto"]["tiers"] == ["small", "large"]
    assert "cascade" not in without  # local-large is SmolLM2 again: no ladder to itself
    # a base URL alone, an empty key, or a key of a provider not in the table change nothing
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "  ")
    monkeypatch.setenv("COHERE_API_KEY", "co-1")
    assert default_config() == without
    assert load_settings(None).model_dump() == parse_settings(without, "the built-in default config").model_dump()


def test_an_openai_key_adds_its_models_above_local_small(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    settings = load_settings(None)
    by_name = {model.name: model for model in settings.models}
    assert list(by_name) == [*LOCAL, "gpt-4.1-mini", "gpt-4.1"]
    mini, strong = by_name["gpt-4.1-mini"], by_name["gpt-4.1"]
    assert (mini.backend, mini.litellm_model, mini.tier) == ("litellm", "openai/gpt-4.1-mini", "commercial")
    assert (strong.litellm_model, strong.tier) == ("openai/gpt-4.1", None)
    assert mini.base_url == strong.base_url == "http://127.0.0.1:9/v1"
    assert mini.api_key.get_secret_value() == "sk-live-1" and mini.hosting_label == "commercial"
    assert mini.price.to_price().cost_usd(10**6, 10**6) == pytest.approx(0.40 + 1.60)
    assert settings.routing.auto.tiers == ["small", "commercial"]
    assert settings.cascade.ladder == ["local-small", "gpt-4.1-mini"]
    assert "sk-live-1" not in "\n".join(describe_default_tiers(settings))


def test_without_a_base_url_litellm_uses_the_providers_own(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-1")
    settings = load_settings(None)
    claude = next(model for model in settings.models if model.name == "claude-haiku-4-5")
    assert claude.base_url is None and claude.litellm_model == "anthropic/claude-haiku-4-5"
    assert describe_default_tiers(settings)[0] == (
        "Anthropic: claude-haiku-4-5 (tier commercial) and claude-sonnet-4-5 through LiteLLM, "
        "key from ANTHROPIC_API_KEY"
    )


def test_with_several_keys_the_first_provider_answers_the_tier_and_the_others_are_its_fallbacks():
    environ = {provider.key_variable: f"key-{provider.name}" for provider in PROVIDERS}
    settings = parse_settings(default_config(environ), "the built-in default config")
    commercial = [model for model in settings.models if model.tier == "commercial"]
    assert [m.name for m in commercial] == [
        "gpt-4.1-mini",
        "claude-haiku-4-5",
        "gemini-2.5-flash",
        "mistral-small-latest",
    ]
    assert [m.fallbacks for m in commercial] == [
        ["claude-haiku-4-5", "gemini-2.5-flash", "mistral-small-latest"],
        ["gemini-2.5-flash", "mistral-small-latest"],
        ["mistral-small-latest"],
        [],
    ]
    assert settings.cascade.ladder == ["local-small", "gpt-4.1-mini"]
    assert [m.api_key.get_secret_value() for m in commercial] == [f"key-{p.name}" for p in PROVIDERS]
    lines = describe_default_tiers(settings, environ)
    assert lines[-2] == (
        "auto routes between small: local-small; commercial: gpt-4.1-mini, claude-haiku-4-5, gemini-2.5-flash, "
        "mistral-small-latest"
    )
    assert lines[-1] == "cascade: local-small -> gpt-4.1-mini"


def test_the_provider_order_holds_whatever_keys_are_set():
    environ = {"MISTRAL_API_KEY": "m", "ANTHROPIC_API_KEY": "a"}
    settings = parse_settings(default_config(environ), "the built-in default config")
    assert [m.name for m in settings.models if m.tier == "commercial"] == ["claude-haiku-4-5", "mistral-small-latest"]
    assert settings.cascade.ladder == ["local-small", "claude-haiku-4-5"]


def test_a_distinct_local_large_stays_on_the_ladder_below_the_commercial_model(monkeypatch):
    monkeypatch.setattr(defaults, "is_installed", lambda name: name == "gemma3-270m")
    assert default_config({})["cascade"] == {"ladder": ["local-small", "local-large"]}
    with_key = default_config({"OPENAI_API_KEY": "k"})
    assert with_key["cascade"] == {"ladder": ["local-small", "local-large", "gpt-4.1-mini"]}
    assert with_key["routing"]["auto"]["tiers"] == ["small", "commercial"]  # the thresholds file has one step


def test_without_keys_the_log_says_which_variables_would_add_tiers():
    settings = parse_settings(default_config({}), "the built-in default config")
    assert describe_default_tiers(settings, {}) == [
        "no provider key in the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY, MISTRAL_API_KEY): "
        "auto and cascade use the local models only",
        "auto routes between small: local-small; large: local-large",
    ]
