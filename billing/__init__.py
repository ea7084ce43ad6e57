"""API keys, prices, the usage ledger and budgets (see the billing issue)."""
