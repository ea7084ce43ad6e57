"""The config checks, one bad file each: a section's own invariants are reported at the section,
what no section can check alone at the top level, in check order (the first problem is the one
reported). The messages are what operators see: each is pinned here word for word."""

from __future__ import annotations

import pytest

from switchyard.core.settings import ConfigError, parse_settings

LLAMA = {"name": "llama", "backend": "vllm", "base_url": "http://127.0.0.1:9/v1"}
BIG = {**LLAMA, "name": "big"}


def _refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_settings(data, "t.yaml")
    head, *lines = str(refused.value).split("\n")
    assert head == "invalid configuration in t.yaml:"
    [line] = lines
    return line


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"routing": {"auto": {"tiers": ["small"], "default_tier": "large"}}},
            "  routing.auto: Value error, default_tier 'large' is not one of tiers ['small']",
        ),
        (
            {"routing": {"auto": {"tiers": ["small", "large"], "quality_models": {"small": "a"}}}},
            "  routing.auto: Value error, quality_models must name a model for each tier (small, large), not for small",
        ),
        (
            {"rollout": {"share": 0.1}},
            "  rollout: Value error, candidate_artifact and share need candidate (the candidate's thresholds file)",
        ),
        (
            {"rollout": {"candidate": "c.yaml", "share": 1.5}},
            "  rollout.share: Input should be less than or equal to 1",
        ),
        (
            {"models": [LLAMA], "cascade": {"ladder": ["llama"]}},
            "  cascade: Value error, a cascade ladder needs at least two rungs",
        ),
        (
            {"models": [LLAMA], "cascade": {"ladder": ["llama", "llama"]}},
            "  cascade: Value error, the cascade ladder names a model twice: ['llama', 'llama']",
        ),
        (
            {"models": [LLAMA, BIG], "cascade": {"ladder": ["llama", "big"], "scorer": "vibes"}},
            "  cascade: Value error, cascade.scorer 'vibes' is not a confidence feature; known: mean_logprob,",
        ),
    ],
)
def test_a_section_reports_its_own_problem_at_the_section(data, expected):
    assert _refusal(data).startswith(expected)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"models": [{**LLAMA, "name": "auto"}]}, "model name 'auto' is reserved: it asks Switchyard to choose"),
        (
            {"models": [{**LLAMA, "degrade_to": "llama"}]},
            "model 'llama' degrades to 'llama', which is not another model",
        ),
        (
            {"models": [{**LLAMA, "fallbacks": ["nobody"]}]},
            "model 'llama' falls back to 'nobody', which is not another model",
        ),
        (
            {"models": [LLAMA, BIG], "cascade": {"ladder": ["llama", "nobody"]}},
            "cascade.ladder names 'nobody', which is not a configured model",
        ),
        (
            {"models": [LLAMA], "teams": {"t": {"api_keys": ["k"], "priority": "urgent"}}},
            "team 't' has priority 'urgent', which is not one of interactive, batch "
            "(name more in billing.priority_tiers)",
        ),
        (
            {
                "models": [LLAMA],
                "billing": {"priority_tiers": {"urgent": {}}},
                "teams": {"t": {"api_keys": ["k"], "priority": "gold"}},
            },
            "team 't' has priority 'gold', which is not one of interactive, batch, urgent "
            "(name more in billing.priority_tiers)",
        ),
        (
            {"models": [LLAMA], "teams": {"t": {"api_keys": ["k"], "models": ["nobody"]}}},
            "team 't' may use 'nobody', which is not a configured model",
        ),
        (
            {"models": [LLAMA], "teams": {"t": {"api_keys": ["k"]}, "u": {"api_keys": ["k"]}}},
            "team 'u': an API key is listed twice (also under 't'); each key names one team",
        ),
        (
            {"models": [{**LLAMA, "logprobs": False}, BIG], "cascade": {"ladder": ["llama", "big"]}},
            "cascade.ladder: 'llama' returns no token logprobs, so it cannot be judged; "
            "such a model can only be the last rung (or set its 'logprobs: true')",
        ),
    ],
)
def test_what_no_section_can_check_alone_is_reported_at_the_top_level(data, expected):
    assert _refusal(data) == f"  (top level): Value error, {expected}"


def test_the_first_problem_in_check_order_is_the_one_reported():
    names_before_links = {"models": [{**LLAMA, "name": "auto", "fallbacks": ["nobody"]}]}
    assert "'auto' is reserved" in _refusal(names_before_links)
    teams_before_logprobs = {
        "models": [{**LLAMA, "logprobs": False}, BIG],
        "cascade": {"ladder": ["llama", "big"]},
        "teams": {"t": {"api_keys": ["k"], "models": ["nobody"]}},
    }
    assert "team 't' may use 'nobody'" in _refusal(teams_before_logprobs)
    # a section that fails stops the checks across sections: only its problem is reported
    section_first = {"models": [{**LLAMA, "name": "auto"}], "cascade": {"ladder": ["llama"]}}
    assert _refusal(section_first) == "  cascade: Value error, a cascade ladder needs at least two rungs"
