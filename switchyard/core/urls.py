"""Upstream addresses without their secrets, and the names clients see instead of addresses.

A `base_url` may carry credentials (`http://user:password@host/v1`). They are taken out before the
URL is used or printed (`split_credentials`) and sent as the upstream's auth; what reaches a
client names a deployment by its backend kind and replica number (`replica_label`), never by its
address. Text that may hold URLs (the request and access logs, `check-config`'s output) goes through
`redact_credentials`: passwords in URLs and credentials in query strings (`?api_key=`) masked.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

_CREDENTIALS_IN_URL = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
# Query parameters that carry a credential (`?api_key=`, `&token=`): their values are masked.
CREDENTIAL_PARAMS = ("api_key", "api-key", "apikey", "x-api-key", "key", "token", "access_token", "password", "secret")
_CREDENTIAL_IN_QUERY = re.compile(
    r"(?P<name>[?&;](?:" + "|".join(re.escape(name) for name in CREDENTIAL_PARAMS) + r")=)[^&;#\s\"]*",
    re.IGNORECASE,
)


def replica_label(kind: str, index: int) -> str:
    """How clients, the ledger and error messages name a deployment: `openai#0`, `vllm#1`.

    `index` is the replica's place in its model's `replicas` list (0 for a single `base_url`).
    """
    return f"{kind}#{index}"


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without `user:password@`, the user, the password), percent-decoded.

    The user and password are None when the URL carries no credentials; the password is None
    when only a user is given (`http://user@host`).
    """
    parts = urlsplit(url)
    userinfo, has_userinfo, host = parts.netloc.rpartition("@")
    if not has_userinfo:
        return url, None, None
    user, has_password, password = userinfo.partition(":")
    clean = urlunsplit(parts._replace(netloc=host))
    return clean, unquote(user), unquote(password) if has_password else None


def has_credentials(url: str) -> bool:
    return split_credentials(url)[1] is not None


def redact_credentials(text: str) -> str:
    """`text` with the password of every URL in it masked: `user:***@`; a lone user (which may
    be a token) becomes `***@`; the value of a credential in a query string (`CREDENTIAL_PARAMS`:
    `?api_key=***`) too. For output that may hold URLs or request targets."""

    def mask(match: re.Match[str]) -> str:
        user, has_password, _ = match["userinfo"].partition(":")
        return match["scheme"] + (f"{user}:***@" if has_password else "***@")

    if "=" in text:
        text = _CREDENTIAL_IN_QUERY.sub(r"\g<name>***", text)
    if "://" not in text:  # no URL: the regex would try a scheme at every letter (a request-log line)
        return text
    return _CREDENTIALS_IN_URL.sub(mask, text)


def mask_password(url: str) -> str:
    """The URL with its password shown as `***` (a database URL in a message or a log line)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
