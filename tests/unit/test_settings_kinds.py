"""A model's kind (chat or embedding) and its LoRA adapters, as the config checks them."""

from __future__ import annotations

import pytest

from switchyard.core.settings import ConfigError, parse_settings

VLLM = {"name": "llama", "backend": "vllm", "base_url": "http://127.0.0.1:9/v1"}
EMBED = {"name": "embed", "backend": "embedded", "model": "all-minilm-l6-v2"}


def _settings(models, **rest):
    return parse_settings({"models": models, **rest}, "test.yaml")


def test_the_embedded_minilm_is_an_embedding_model_with_its_own_window():
    [model] = _settings([EMBED]).models
    assert model.kind == "embedding" and model.effective_context_window == 256


@pytest.mark.parametrize(
    ("models", "rest", "expected"),
    [
        ([{**EMBED, "kind": "chat"}], {}, "is an embedding model: kind must be 'embedding'"),
        ([{"name": "x", "backend": "embedded", "model": "smollm2-135m", "kind": "embedding"}], {}, "not an embedding"),
        ([EMBED, {**VLLM, "fallbacks": ["embed"]}], {}, "both must be of one kind"),
        ([{**EMBED, "tier": "small"}], {}, "it has no tier"),
        ([EMBED, VLLM], {"cascade": {"ladder": ["embed", "llama"]}}, "an embedding model"),
        ([{**VLLM, "adapters": [{"name": "llama", "path": "/a"}]}], {}, "adapter name 'llama' is taken"),
        ([{**VLLM, "adapters": [{"name": "auto", "path": "/a"}]}], {}, "adapter name 'auto' is taken"),
        ([{**VLLM, "adapters": [{"name": "a", "path": "/a", "teams": ["nobody"]}]}], {}, "team 'nobody'"),
        ([{**EMBED, "adapters": [{"name": "a", "path": "/a"}]}], {}, "an embedding model takes no adapters"),
        (
            [{**VLLM, "adapters": [{"name": "a", "path": "/a"}]}],
            {"teams": {"t": {"api_keys": ["k"], "default_adapters": ["b"]}}},
            "default adapter 'b', which is not configured",
        ),
        (
            [{**VLLM, "adapters": [{"name": "a", "path": "/a", "teams": ["u"]}]}],
            {"teams": {"t": {"api_keys": ["k"], "default_adapters": ["a"]}, "u": {"api_keys": ["k2"]}}},
            "default adapter 'a', which it may not use",
        ),
        (
            [{**VLLM, "adapters": [{"name": "a", "path": "/a"}, {"name": "b", "path": "/b"}]}],
            {"teams": {"t": {"api_keys": ["k"], "default_adapters": ["a", "b"]}}},
            "two default adapters on model 'llama'",
        ),
    ],
)
def test_bad_kinds_and_adapters_name_the_problem(models, rest, expected):
    with pytest.raises(ConfigError) as refused:
        _settings(models, **rest)
    assert expected in str(refused.value)


def test_adapters_share_the_model_namespace_and_a_team_may_name_one():
    settings = _settings(
        [{**VLLM, "adapters": [{"name": "support", "path": "/adapters/support", "teams": ["t"]}]}],
        teams={"t": {"api_keys": ["k"], "models": ["support"], "default_adapters": ["support"]}},
    )
    [adapter] = settings.models[0].adapters
    assert (adapter.name, adapter.teams) == ("support", ["t"])
    assert settings.teams["t"].default_adapters == ["support"]
