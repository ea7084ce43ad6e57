"""Offline evaluation of routing and cascading (see the evals issue)."""
