"""The database: the usage ledger, teams and keys (SQLite or PostgreSQL), with versioned migrations.

`open_database(url)` opens either and brings its schema up to date; both implement `Database`
(base.py). The dialects live in sqlite.py and postgres.py, their migrations in migrations.py.
"""

from switchyard.billing.store.base import Database, open_database
from switchyard.billing.store.errors import StoreConflict, StoreError, StoreNotFound, StoreUnavailable

__all__ = ["Database", "StoreConflict", "StoreError", "StoreNotFound", "StoreUnavailable", "open_database"]
