"""List prices for the models in the public evaluation data."""

from __future__ import annotations

from switchyard.core.prices import Price

# List prices at the time the RouteLLM data was made (OpenAI's for GPT-4 Turbo; a typical hosted
# price for Mixtral-8x7B). Override per run with a YAML file of the same shape.
PRICES: dict[str, Price] = {
    "gpt-4-1106-preview": Price(10.0, 30.0),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": Price(0.6, 0.6),
    # arena-bench-v1's pair (the same models, as that set names them).
    "gpt-4-turbo": Price(10.0, 30.0),
    "Mixtral-8x7B-Instruct-v0.1": Price(0.6, 0.6),
    # vicuna80's pair: gpt-3.5-turbo's list price when its answers were made (March 2023); a
    # typical hosted price for a 13B open model.
    "gpt-3.5-turbo:20230327": Price(2.0, 2.0),
    "llama-13b:v1": Price(0.3, 0.3),
    # LLMRouter's open models: typical hosted prices per million tokens, by size.
    "llama-3.1-8b-instruct": Price(0.18, 0.18),
    "qwen2.5-7b-instruct": Price(0.18, 0.18),
    "gemma-2-9b-it": Price(0.2, 0.2),
    "mistral-7b-instruct-v0.3": Price(0.18, 0.18),
    "codegemma-7b": Price(0.18, 0.18),
    "llama3-chatqa-1.5-8b": Price(0.18, 0.18),
    "llama-3.3-nemotron-super-49b-v1": Price(0.8, 0.8),
    "llama-3.1-nemotron-51b-instruct": Price(0.8, 0.8),
    "llama3-chatqa-1.5-70b": Price(0.88, 0.88),
}
