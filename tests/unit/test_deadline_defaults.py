"""Deadlines are on by default, and documented."""

from __future__ import annotations

from pathlib import Path

from switchyard.backends.defaults import load_settings
from switchyard.core.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_default_config_has_deadlines():
    resilience = load_settings(None).resilience
    assert resilience.first_token_timeout_s is not None and resilience.first_token_timeout_s <= 30
    assert resilience.request_timeout_s is not None
    assert resilience.first_token_budget_s is not None and resilience.first_token_budget_s < 60


def test_the_defaults_are_documented():
    resilience = Settings().resilience
    configuration = (DOCS / "configuration.md").read_text()
    for key in ("first_token_timeout_s", "first_token_budget_s", "request_timeout_s"):
        assert f"{getattr(resilience, key):g}" in configuration.split(key, 1)[1].split("\n", 1)[0], key
    for key in ("first_token_timeout_s", "request_timeout_s", "assemble_from_stream"):
        assert f"models[].{key}" in configuration or f"`{key}`" in configuration


def test_a_model_takes_its_own_deadlines():
    settings = Settings(
        models=[
            {"name": "m", "base_url": "http://127.0.0.1:1/v1", "first_token_timeout_s": 5, "request_timeout_s": 60},
            {"name": "c", "backend": "litellm", "litellm_model": "openai/gpt-4o"},
            {"name": "v", "backend": "vllm", "base_url": "http://127.0.0.1:2/v1", "assemble_from_stream": False},
            {"name": "e", "backend": "embedded", "model": "smollm2-135m"},
        ]
    )
    first, commercial, opted_out, embedded = settings.models
    # whole answers asked as streams by default where an upstream is called, so the deadlines guard them
    assert (first.first_token_timeout_s, first.request_timeout_s, first.assemble_from_stream) == (5, 60, True)
    assert (commercial.first_token_timeout_s, commercial.assemble_from_stream) == (None, True)
    assert not opted_out.assemble_from_stream
    assert not embedded.assemble_from_stream  # in-process: its own stream either way
