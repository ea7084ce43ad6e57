"""List prices for the models in the public evaluation data."""

from __future__ import annotations

from switchyard.core.prices import Price

# List prices at the time the RouteLLM data was made (OpenAI's for GPT-4 Turbo; a typical hosted
# price for Mixtral-8x7B). Override per run with a YAML file of the same shape.
PRICES: dict[str, Price] = {
    "gpt-4-1106-preview": Price(10.0, 30.0),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": Price(0.6, 0.6),
}
