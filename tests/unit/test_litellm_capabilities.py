"""A LiteLLM model's capabilities come from LiteLLM's bundled model map, offline."""

from __future__ import annotations

import pytest

from switchyard.backends.commercial import CommercialBackend
from switchyard.core.capabilities import Capabilities


def test_a_known_openai_model():
    assert CommercialBackend("gpt", "openai/gpt-4o").capabilities() == Capabilities(context_window=128_000)


def test_a_reasoning_model_without_logprobs_or_images():
    caps = CommercialBackend("o3", "openai/o3-mini").capabilities()
    assert (caps.tools, caps.json_schema, caps.n) == (True, True, True)
    assert (caps.logprobs, caps.vision, caps.parallel_tool_calls) == (False, False, False)
    assert caps.context_window == 200_000


def test_a_known_anthropic_model():
    caps = CommercialBackend("claude", "anthropic/claude-sonnet-4-20250514").capabilities()
    assert (caps.tools, caps.parallel_tool_calls, caps.vision, caps.json_object, caps.json_schema) == (True,) * 5
    assert (caps.logprobs, caps.n) == (False, False)  # Anthropic has neither
    assert caps.context_window == 200_000


@pytest.mark.parametrize("litellm_model", ["openai/our-private-fine-tune", "anthropic/claude-3-5-sonnet-20241022"])
def test_a_model_litellm_does_not_know_is_trusted_with_everything(litellm_model):
    # claude-3-5-sonnet-20241022 is retired: the installed LiteLLM's map no longer has it
    assert CommercialBackend("x", litellm_model).capabilities() == Capabilities()


def test_the_config_overrides_what_litellm_says():
    from switchyard.backends.registry import build_registry
    from switchyard.core.settings import Settings

    settings = Settings(
        models=[
            {
                "name": "gpt",
                "backend": "litellm",
                "litellm_model": "openai/gpt-4o",
                "capabilities": {"vision": False},
            },
            {"name": "small", "backend": "litellm", "litellm_model": "openai/gpt-4o", "context_window": 8192},
        ]
    )
    registry = build_registry(settings, None)
    gpt, small = registry.get("gpt").capabilities, registry.get("small").capabilities
    assert (gpt.vision, gpt.tools, gpt.context_window) == (False, True, 128_000)
    assert (small.vision, small.context_window) == (True, 8192)


async def test_the_map_is_read_off_the_event_loop_when_the_backend_starts_and_only_then_it_is_ready():
    import asyncio
    import threading

    backend = CommercialBackend("gpt", "openai/gpt-4o")
    loop_thread = threading.get_ident()
    read_in = []
    read = backend.capabilities

    def recording_read():
        read_in.append(threading.get_ident())
        return read()

    backend.capabilities = recording_read  # type: ignore[method-assign]
    assert not backend.is_ready()
    await asyncio.wait_for(backend.start(), 120)
    assert backend.is_ready()
    assert read_in and loop_thread not in read_in  # LiteLLM was imported and read in a worker thread
    assert read() == Capabilities(context_window=128_000)


@pytest.mark.parametrize(
    ("litellm_model", "input_usd_per_mtok"),
    [("mistral/mistral-small-latest", 0.15), ("gemini/gemini-2.5-flash", 0.3), ("anthropic/claude-haiku-4-5", 1.0)],
)
def test_the_price_map_is_read_under_the_provider_prefixed_name_or_the_bare_one(litellm_model, input_usd_per_mtok):
    """Mistral's and Gemini's entries are keyed with the provider (`mistral-small-latest` alone is
    not in the map); Anthropic's and OpenAI's without it."""
    price = CommercialBackend("m", litellm_model).price()
    assert price is not None and price.input_usd_per_mtok == pytest.approx(input_usd_per_mtok)
