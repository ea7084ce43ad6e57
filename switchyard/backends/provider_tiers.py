"""Commercial tiers from provider keys in the environment, for the built-in default config.

With no config file, a provider key in the environment (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`,
`GEMINI_API_KEY`, `MISTRAL_API_KEY`) adds two of that provider's models through LiteLLM: a
capable, inexpensive one in the tier `commercial`, which `auto` routes hard prompts to and the
cascade climbs to from `local-small`, and a stronger one that clients name to use. The provider's
base URL variable, when set, is the models' `base_url` (LiteLLM's `api_base`); the key is their
`api_key`. Prices are the providers' list prices in USD per million tokens (input, output, cached
input and, where the provider charges for it, cache writes), as LiteLLM's model map has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchyard.core.prices import Price

COMMERCIAL_TIER = "commercial"


@dataclass(frozen=True, slots=True)
class ProviderModel:
    name: str  # the public name: the provider's own model id
    litellm_model: str
    price: Price


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    key_variable: str
    base_url_variable: str  # LiteLLM reads it too when no api_base is given
    routed: ProviderModel  # in the tier `commercial`: auto's hard prompts, the cascade's last rung
    strong: ProviderModel  # by name only


# In this order: with several keys, the first provider's model answers the tier and the others are
# its fallbacks.
PROVIDERS = (
    Provider(
        "OpenAI",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        ProviderModel("gpt-4.1-mini", "openai/gpt-4.1-mini", Price(0.40, 1.60, 0.10)),
        ProviderModel("gpt-4.1", "openai/gpt-4.1", Price(2.00, 8.00, 0.50)),
    ),
    Provider(
        "Anthropic",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        ProviderModel("claude-haiku-4-5", "anthropic/claude-haiku-4-5", Price(1.00, 5.00, 0.10, 1.25)),
        ProviderModel("claude-sonnet-4-5", "anthropic/claude-sonnet-4-5", Price(3.00, 15.00, 0.30, 3.75)),
    ),
    Provider(
        "Gemini",
        "GEMINI_API_KEY",
        "GEMINI_API_BASE",
        ProviderModel("gemini-2.5-flash", "gemini/gemini-2.5-flash", Price(0.30, 2.50, 0.03)),
        ProviderModel("gemini-2.5-pro", "gemini/gemini-2.5-pro", Price(1.25, 10.00, 0.125)),
    ),
    Provider(
        "Mistral",
        "MISTRAL_API_KEY",
        "MISTRAL_API_BASE",
        ProviderModel("mistral-small-latest", "mistral/mistral-small-latest", Price(0.15, 0.60, 0.015)),
        ProviderModel("mistral-large-latest", "mistral/mistral-large-latest", Price(0.50, 1.50, 0.05)),
    ),
)


@dataclass(frozen=True, slots=True)
class LiveProvider:
    """A provider whose key is in the environment."""

    provider: Provider
    api_key: str
    base_url: str | None

    def model_entries(self, fallbacks: Sequence[str]) -> list[dict[str, Any]]:
        """Its two models as `models:` entries; `fallbacks` for the routed one."""
        routed, strong = self.provider.routed, self.provider.strong
        entries = [self._entry(routed, tier=COMMERCIAL_TIER), self._entry(strong)]
        if fallbacks:
            entries[0]["fallbacks"] = list(fallbacks)
        return entries

    def _entry(self, model: ProviderModel, tier: str | None = None) -> dict[str, Any]:
        price = {
            "input_usd_per_mtok": model.price.input_usd_per_mtok,
            "output_usd_per_mtok": model.price.output_usd_per_mtok,
            "cached_input_usd_per_mtok": model.price.cached_input_usd_per_mtok,
            "cache_write_usd_per_mtok": model.price.cache_write_usd_per_mtok,
        }
        entry: dict[str, Any] = {
            "name": model.name,
            "backend": "litellm",
            "litellm_model": model.litellm_model,
            "api_key": self.api_key,
            "price": price,
        }
        if self.base_url is not None:
            entry["base_url"] = self.base_url
        if tier is not None:
            entry["tier"] = tier
        return entry

    def describe(self) -> str:
        """Which models, from which variables; never the key."""
        provider = self.provider
        text = f"{provider.routed.name} (tier {COMMERCIAL_TIER}) and {provider.strong.name} through LiteLLM"
        text += f", key from {provider.key_variable}"
        if self.base_url is not None:
            text += f", base URL {self.base_url} from {provider.base_url_variable}"
        return text


def providers_in_environment(environ: Mapping[str, str]) -> list[LiveProvider]:
    """The providers whose key is set (and not empty) in `environ`, in the order of PROVIDERS."""
    live = []
    for provider in PROVIDERS:
        key = environ.get(provider.key_variable, "").strip()
        if key:
            base_url = environ.get(provider.base_url_variable, "").strip() or None
            live.append(LiveProvider(provider, key, base_url))
    return live


def provider_models(live: Sequence[LiveProvider]) -> list[dict[str, Any]]:
    """The `models:` entries of every live provider; each routed model falls back to the routed
    models of the providers after it."""
    routed = [p.provider.routed.name for p in live]
    return [entry for i, p in enumerate(live) for entry in p.model_entries(routed[i + 1 :])]
