"""The response cache's config (the Contract's keys, YAML's bare `off`, clear errors), its keys
(what changes an answer is in them, what only changes its delivery is not) and its policy (mode by
team, route and config; what bypasses it; scopes)."""

from __future__ import annotations

import pytest

from switchyard.cache.keys import request_keys
from switchyard.cache.policy import SHARED_SCOPE, CachePolicy, client_refuses
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.settings import ConfigError, Settings, read_settings_file

MODEL = {"name": "m", "base_url": "http://127.0.0.1:9/v1"}


def _chat(**fields) -> ChatCompletionRequest:
    payload = {"model": "m", "messages": [{"role": "user", "content": "How do I enable X?"}], **fields}
    return ChatCompletionRequest.from_payload(payload)


def test_the_contracts_yaml_reads_with_a_bare_off_and_a_teams_mode(tmp_path):
    path = tmp_path / "switchyard.yaml"
    path.write_text(
        "models:\n  - {name: m, base_url: 'http://127.0.0.1:9/v1'}\n"
        "cache:\n  mode: off\n  ttl_s: 3600\n  max_entries: 10000\n  similarity: null\n"
        "teams:\n  support: {api_keys: [sk-1], cache: semantic}\n  other: {api_keys: [sk-2], cache: off}\n"
    )
    settings = read_settings_file(path)
    assert settings.cache.mode == "off" and settings.cache.similarity is None
    assert (settings.teams["support"].cache, settings.teams["other"].cache) == ("semantic", "off")
    policy = CachePolicy.of(settings)
    assert policy.is_on and policy.mode_for("support", "m") == "semantic" and policy.mode_for("other", "m") == "off"
    assert not CachePolicy.of(Settings(models=[MODEL])).is_on  # off by default


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"mode": "fuzzy"}, "cache.mode: Input should be 'off', 'exact' or 'semantic'"),
        ({"similarity": 1.5}, "cache.similarity: Input should be less than or equal to 1"),
        ({"routes": {"nope": {"mode": "exact"}}}, "cache.routes names 'nope', which is not a configured chat model"),
        ({"ttl": 5}, "unknown key 'cache.ttl'"),
    ],
)
def test_a_bad_cache_section_is_named_in_the_error(tmp_path, cache, message):
    from switchyard.core.settings import parse_settings

    with pytest.raises(ConfigError) as caught:
        parse_settings({"models": [MODEL], "cache": cache}, "switchyard.yaml")
    assert message in str(caught.value)


def test_the_exact_key_ignores_delivery_and_holds_everything_that_changes_the_answer():
    base = request_keys(_chat(temperature=0), "m", "m")
    same = [
        _chat(temperature=0, stream=True, stream_options={"include_usage": True}),
        _chat(temperature=0, user="u-2", metadata={"run": "2"}),
    ]
    for request in same:
        assert request_keys(request, "m", "m").exact == base.exact
    other = [
        _chat(temperature=0, max_tokens=5),
        _chat(temperature=0, seed=3),
        _chat(temperature=0, tools=[{"type": "function", "function": {"name": "f"}}]),
        _chat(temperature=0, response_format={"type": "json_object"}),
        _chat(temperature=0, messages=[{"role": "system", "content": "Be brief."}, _chat().messages[0].model_dump()]),
    ]
    for request in other:
        assert request_keys(request, "m", "m").exact != base.exact
    assert request_keys(_chat(temperature=0), "auto", "m").exact != base.exact  # the route is in it
    assert request_keys(_chat(temperature=0), "m", "m-lora").exact != base.exact  # and what it resolved to


def test_the_context_key_is_everything_but_the_last_user_turns_text():
    asked = request_keys(_chat(temperature=0), "m", "m")
    reworded = request_keys(_chat(temperature=0, messages=[{"role": "user", "content": "How to turn on X?"}]), "m", "m")
    assert asked.context == reworded.context and asked.exact != reworded.exact
    assert reworded.asked == "How to turn on X?"
    hotter = request_keys(_chat(temperature=0, max_tokens=9), "m", "m")
    assert hotter.context != asked.context
    image = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    assert request_keys(_chat(messages=[{"role": "user", "content": image}]), "m", "m").context is None


def test_the_policy_bypasses_what_it_cannot_replay_and_scopes_by_team():
    settings = Settings(
        models=[MODEL],
        cache={"mode": "exact", "routes": {"auto": {"mode": "semantic", "nondeterministic": True}}},
        teams={"a": {"api_keys": ["k1"]}, "b": {"api_keys": ["k2"], "cache": "off"}},
    )
    policy = CachePolicy.of(settings)
    assert policy.verdict(_chat(temperature=0), "m", "a", client_refuses=False) == "exact"
    assert policy.verdict(_chat(seed=1), "m", "a", client_refuses=False) == "exact"
    assert policy.verdict(_chat(), "m", "a", client_refuses=False) == "bypass"  # temperature unset: 1
    assert policy.verdict(_chat(temperature=0, n=2), "m", "a", client_refuses=False) == "bypass"
    assert policy.verdict(_chat(temperature=0), "m", "a", client_refuses=True) == "bypass"
    assert policy.verdict(_chat(temperature=0.8), "auto", "a", client_refuses=False) == "semantic"  # opted in
    assert policy.verdict(_chat(temperature=0), "m", "b", client_refuses=False) == "off"
    assert (policy.scope_of("a"), policy.scope_of("b")) == ("a", "b")
    shared = CachePolicy.of(Settings(models=[MODEL], cache={"mode": "exact", "scope": "shared"}))
    assert shared.scope_of("a") == shared.scope_of("b") == SHARED_SCOPE


@pytest.mark.parametrize(
    ("header", "control", "refuses"),
    [("off", None, True), ("OFF", None, True), (None, "no-cache", True), (None, "max-age=0, no-store", True)],
)
def test_the_client_refuses_by_either_header(header, control, refuses):
    assert client_refuses(header, control) is refuses
    assert client_refuses(None, "max-age=60") is False and client_refuses("on", None) is False


@pytest.mark.parametrize(
    ("cache", "embedder", "similarity"),
    [
        ({"mode": "semantic"}, "static", 0.975),  # the default: the classifier's table, its own threshold
        ({"mode": "semantic", "embedder": "minilm"}, "minilm", 0.895),
        ({"mode": "semantic", "embedder": "minilm", "similarity": 0.93}, "minilm", 0.93),  # a configured one wins
    ],
)
def test_the_threshold_is_the_one_picked_for_the_embedder_unless_configured(cache, embedder, similarity):
    policy = CachePolicy.of(Settings(models=[MODEL], cache=cache))
    assert (policy.settings.embedder, policy.similarity) == (embedder, similarity)
    assert policy.is_semantic_anywhere
    assert not CachePolicy.of(Settings(models=[MODEL], cache={"mode": "exact"})).is_semantic_anywhere
