"""Offline evaluation: traces, routing metrics, threshold and cascade tuning, classifier training."""
