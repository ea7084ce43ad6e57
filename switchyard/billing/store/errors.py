"""Errors of the database layer, translated from sqlite3 / asyncpg at the boundary.

StoreError              anything the store could not do
├── StoreUnavailable    the database cannot be reached, is locked or did not answer in time
├── StoreConflict       the thing to create exists already (a team's name)
└── StoreNotFound       the thing to change does not exist (a team, a key id)
"""

from __future__ import annotations


class StoreError(Exception):
    """Anything the store could not do; the message says what (never a password)."""


class StoreUnavailable(StoreError):
    """The database cannot be reached, is locked or did not answer in time: worth retrying later."""


class StoreConflict(StoreError):
    """The thing to create exists already."""


class StoreNotFound(StoreError):
    """The thing to change does not exist."""
