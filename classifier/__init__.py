"""Query-complexity classifier (see the classifier issue)."""
