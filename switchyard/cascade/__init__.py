"""The logprob-confidence cascade: answer with a cheap model, climb when it is unsure."""
