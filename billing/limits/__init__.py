"""Budgets and rate limits: in this process, or shared by every replica in Valkey/Redis."""
