"""The database: the usage ledger, teams and keys (SQLite or PostgreSQL), with versioned migrations."""
