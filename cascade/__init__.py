"""Logprob-confidence cascade (see the cascade issue)."""
