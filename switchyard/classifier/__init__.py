"""The query-complexity classifier that routes `model="auto"`."""
