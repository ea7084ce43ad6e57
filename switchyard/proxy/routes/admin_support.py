"""What the admin routes and /v1/usage share: the admin key check and the database they need."""

from __future__ import annotations

from fastapi import Request

from switchyard.billing.store import Database
from switchyard.core.errors import AuthenticationFailed, InvalidRequest
from switchyard.proxy.app_state import services_of
from switchyard.proxy.auth import is_admin


def require_admin(request: Request) -> None:
    if services_of(request).settings.auth.admin_key is None:
        raise AuthenticationFailed("The admin API is off: set auth.admin_key in the configuration to use it.")
    if not is_admin(services_of(request), request):
        raise AuthenticationFailed("This endpoint needs the admin key: send 'Authorization: Bearer <auth.admin_key>'.")


def database_of(request: Request) -> Database:
    database = services_of(request).database
    if database is None:
        raise InvalidRequest(
            "Usage, teams and keys need a database: set billing.database_url (or billing.ledger_path)."
        )
    return database
