"""Credentials in a base_url are taken out of it and become the replica's auth; replicas are named
by kind and place (`openai#0`), and nothing a replica prints holds the secret."""

from __future__ import annotations

import base64

import aiohttp
import pytest

from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.backends.vllm import VLLMReplica
from switchyard.core.settings import ConfigError, parse_settings
from switchyard.core.urls import redact_credentials, split_credentials
from tests.conftest import closed_port


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:9/v1", ("http://127.0.0.1:9/v1", None, None)),
        ("http://alice:pw@127.0.0.1:9/v1", ("http://127.0.0.1:9/v1", "alice", "pw")),
        ("https://al%40ce:p%3Aw%2F@h/v1?x=1", ("https://h/v1?x=1", "al@ce", "p:w/")),
        ("http://token@[::1]:80/v1", ("http://[::1]:80/v1", "token", None)),
    ],
)
def test_split_credentials(url, expected):
    assert split_credentials(url) == expected


def test_redact_credentials_masks_every_url_in_a_text():
    text = "a: http://alice:pw@h/v1\nb: postgresql://me:***@db/x\nc: https://tok@h\nd: http://h:80/v1"
    assert (
        redact_credentials(text)
        == "a: http://alice:***@h/v1\nb: postgresql://me:***@db/x\nc: https://***@h\nd: http://h:80/v1"
    )


def test_credentials_become_basic_auth_and_leave_the_url():
    replica = Replica("http://alice:p%2Fw@127.0.0.1:9/v1/")
    assert replica.base_url == "http://127.0.0.1:9/v1"
    assert replica.headers["authorization"] == _basic("alice", "p/w")
    assert "p/w" not in repr(replica) and "p%2Fw" not in repr(replica)


def test_an_api_key_is_a_bearer_key_and_never_in_the_repr():
    replica = Replica("http://127.0.0.1:9/v1", "sk-secret")
    assert replica.headers["authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in repr(replica)


def test_credentials_and_an_api_key_together_are_refused():
    with pytest.raises(ValueError, match="carries credentials and an api_key") as info:
        Replica("http://alice:pw@127.0.0.1:9/v1", "sk-secret")
    assert "pw" not in str(info.value) and "sk-secret" not in str(info.value)


async def test_replicas_are_named_by_kind_and_place():
    down = f"127.0.0.1:{closed_port()}"
    async with aiohttp.ClientSession() as session:
        backend = OpenAIHTTPBackend("m", [Replica(f"http://{down}/v1"), Replica(f"http://u:pw@{down}/v1")], session)
        assert [r.label for r in backend.replicas] == ["openai#0", "openai#1"]
        vllm = OpenAIHTTPBackend("v", [VLLMReplica(f"http://{down}/v1"), VLLMReplica(f"http://{down}/v1")], session)
        assert [r.label for r in vllm.replicas] == ["vllm#0", "vllm#1"]
        health = await backend.health()  # nothing listens there; the detail is for the log
        assert "u:pw" not in health.detail and f"openai#1 at http://{down}/v1" in health.detail


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            {"name": "m", "base_url": "http://u:pw@h/v1", "api_key": "sk-1"},
            "model 'm': base_url carries credentials (user:password@) and api_key is set too",
        ),
        (
            {
                "name": "m",
                "backend": "vllm",
                "replicas": [{"base_url": "http://h/v1"}, {"base_url": "http://u:pw@h/v1", "api_key": "k"}],
            },
            "model 'm': replicas[1].base_url carries credentials (user:password@) and replicas[1].api_key is set too",
        ),
        (
            {"name": "m", "backend": "litellm", "litellm_model": "openai/gpt-4o", "base_url": "http://u:pw@h/v1"},
            "model 'm': base_url carries credentials (user:password@); put the key in api_key",
        ),
    ],
)
def test_conflicting_credentials_are_a_config_error_naming_the_model(model, expected):
    with pytest.raises(ConfigError) as info:
        parse_settings({"models": [model]}, "test.yaml")
    assert expected in str(info.value)
    assert "pw" not in str(info.value)


def test_credentials_alone_or_an_api_key_alone_are_fine():
    settings = parse_settings(
        {
            "models": [
                {"name": "a", "base_url": "http://u:pw@h/v1"},
                {"name": "b", "base_url": "http://h/v1", "api_key": "sk"},
                {
                    "name": "c",
                    "replicas": [{"base_url": "http://u:pw@h/v1"}, {"base_url": "http://h/v1", "api_key": "k"}],
                },
            ]
        },
        "test.yaml",
    )
    assert [m.name for m in settings.models] == ["a", "b", "c"]


def test_litellm_messages_name_the_deployment_not_its_api_base():
    from switchyard.backends.commercial import CommercialBackend

    backend = CommercialBackend("m", "openai/gpt-4o", api_base="http://10.1.2.3:4000/v1/", api_key="sk-1")
    error = backend._translate(RuntimeError("Connection error: http://10.1.2.3:4000/v1/chat/completions"))
    assert "10.1.2.3" not in error.message and "litellm#0" in error.message


def test_redaction_leaves_text_without_a_url_as_it_is_and_masks_one_with_credentials():
    line = '{"event":"request","team":"a@b","path":"/v1/chat/completions"}'
    assert redact_credentials(line) is line
    assert redact_credentials(line + " http://u:p@host/v1") == line + " http://u:***@host/v1"
