"""Teams and API keys: who is calling, which models it may use, its budgets and rate limits.

Teams come from the YAML file and from the database (created at run time by `switchyard teams`
or the admin API). A key names a team; keys are stored as SHA-256 digests only, shown once.
With no teams anywhere the proxy is open: any key is accepted and every model may be used.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass

PRIORITY_DEFAULT = "interactive"


@dataclass(frozen=True, slots=True)
class _Limits:
    """The largest budget and per-minute limit anyone may set (what the counters and columns hold)."""

    max_usd: float = 1e9
    max_per_minute: int = 2**31 - 1


LIMITS = _Limits()


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    models: frozenset[str] | None = None  # None: every configured model
    budget_usd_per_day: float | None = None  # None: no budget
    budget_usd_per_month: float | None = None
    rpm: int | None = None  # requests per minute; None: no limit
    tpm: int | None = None  # tokens per minute (prompt + max_tokens); None: no limit
    priority: str = PRIORITY_DEFAULT  # interactive | batch | a tier named in billing.priority_tiers
    source: str = "yaml"  # yaml | database
    default_adapters: tuple[str, ...] = ()  # LoRA adapters `auto` applies on their base models

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str  # key_…
    team: str
    prefix: str  # the first characters of the key, for logs and reports (never enough to use)
    digest: bytes  # SHA-256 of the key
    budget_usd_per_day: float | None = None
    budget_usd_per_month: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    created_at: float | None = None  # unix seconds
    expires_at: float | None = None
    revoked_at: float | None = None

    def is_usable(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request: its team and the key it used."""

    team: Team
    key: ApiKey


KEY_PREFIX = "sk-sy-"
SHOWN_PREFIX_LENGTH = len(KEY_PREFIX) + 6


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_id_for(key_digest: bytes) -> str:
    """A key's id, derived from its digest (YAML keys) — database keys get a random one."""
    return "key_" + key_digest.hex()[:16]


def shown_prefix(key: str) -> str:
    return key[:SHOWN_PREFIX_LENGTH] + "…"


def new_key() -> tuple[str, str, str, bytes]:
    """A fresh key: (the key itself, its id, its shown prefix, its digest). The key is shown once."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, "key_" + secrets.token_hex(8), shown_prefix(key), digest(key)


def issue_key(
    team: str,
    *,
    budget_usd_per_day: float | None = None,
    budget_usd_per_month: float | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    expires_at: float | None = None,
) -> tuple[str, ApiKey]:
    """A fresh key for `team` and its record, created now: (the key, shown once; the record)."""
    key, key_id, prefix, key_digest = new_key()
    limits = (budget_usd_per_day, budget_usd_per_month, rpm, tpm)
    return key, ApiKey(key_id, team, prefix, key_digest, *limits, time.time(), expires_at)


def same_digest(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


def yaml_keys(team: str, keys: Iterable[str]) -> list[ApiKey]:
    """The keys a YAML team lists, as ApiKey records (no expiry, no limits of their own)."""
    return [ApiKey(key_id_for(d := digest(k)), team, shown_prefix(k), d) for k in keys]
