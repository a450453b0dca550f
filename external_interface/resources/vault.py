"""A short-lived hand-off for secrets between production steps.

A step that obtains a secret (a session cookie after login, a device id after registration)
puts it here under a random ticket and yields only the ticket; the next step takes it out
(GETDEL, so it is read once) and adds it to the pool. Tickets expire, so an abandoned run
leaves nothing behind. The secret is sealed (utils/seal.py): Redis's files never show it.

    <p>:vault:<kind>:<site>:<ticket>   string (sealed JSON), EX ttl
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

import redis

from config import get_settings
from exceptions import CrawlError, Policy
from external_interface.resources.pool import Pool
from utils.redis import get_redis
from utils.seal import Sealer, get_sealer

TTL = 900


class TicketGone(CrawlError):
    """The ticket expired or was never issued: nothing to add (retrying cannot help)."""

    policy = Policy.FAIL


def _key(kind: str, site: str, ticket: str, prefix: str | None) -> str:
    return f"{prefix if prefix is not None else get_settings().key_prefix}:vault:{kind}:{site}:{ticket}"


def put(
    kind: str,
    site: str,
    secret: Mapping[str, Any],
    *,
    ttl: int = TTL,
    rds: redis.Redis | None = None,
    prefix: str | None = None,
    sealer: Sealer | None = None,
) -> str:
    ticket = secrets.token_hex(12)
    sealed = (sealer or get_sealer()).seal(json.dumps(dict(secret)))
    (rds or get_redis()).set(_key(kind, site, ticket, prefix), sealed, ex=ttl)
    return ticket


def take(
    kind: str,
    site: str,
    ticket: str,
    *,
    rds: redis.Redis | None = None,
    prefix: str | None = None,
    sealer: Sealer | None = None,
) -> dict[str, Any] | None:
    raw = (rds or get_redis()).getdel(_key(kind, site, ticket, prefix))
    if raw is None:
        return None
    return json.loads((sealer or get_sealer()).open(raw, f"the {kind} of site {site} in the vault"))


def member_id(kind: str, ticket: str) -> str:
    """The pool id a ticket becomes: derived, so a redelivered add step is idempotent."""
    return f"{kind[:2]}-{ticket[:12]}"


def into_pool(pool: Pool, ticket: str) -> str:
    """Move a ticket's secret into `pool`; returns the member id (again on a redelivery)."""
    mid = member_id(pool.kind, ticket)
    secret = take(
        pool.kind, pool.site, ticket, rds=pool.rds, prefix=pool.prefix, sealer=pool.sealer
    )
    if secret is None:
        if mid in pool:
            return mid
        raise TicketGone(f"{pool.name}: ticket expired or already used")
    pool.add(secret, mid)
    return mid
