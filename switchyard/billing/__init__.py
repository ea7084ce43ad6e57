"""Teams and API keys, budgets, the usage ledger, the per-request meter and request context."""
