"""Cookie pools per site and the `cookie` provider (see external_interface.resources.pool for the pool).

`prepare` lends one session exclusively (least recently used, past its cool-down, not one this
task already failed with) and puts its cookies on the request; `feedback` judges the response
with the site's ban rules (a login wall, a 401) and retires a banned session, raising
`LoginRequired` so the task retries with another. An empty pool makes the task wait (it is
re-queued without holding its worker slot) while the site's production chain logs in anew.

Only the session's opaque id ("co-1a2b...") appears in leases, task metadata and logs; the
cookie values live in the pool's `:secret` hash and on the outgoing request, nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from config import Settings
from external_interface.resources.base import OutgoingRequest, providers
from external_interface.resources.health import PoolHealth
from external_interface.resources.pool import Lease, Pool, PoolProvider, health_records

KIND = "cookie"


class CookieProvider(PoolProvider):
    kind = KIND

    def apply(self, req: OutgoingRequest, lease: Lease) -> None:
        req.cookies.update(lease.secret.get("cookies", {}))


def cookie_pool(site: str, **kw: Any) -> Pool:
    return Pool(KIND, site, **kw)


def add_cookies(
    site: str, cookies: Mapping[str, str], member_id: str | None = None, **kw: Any
) -> str | None:
    """Put a logged-in session into the site's pool; returns its opaque id."""
    return cookie_pool(site, **kw).add({"cookies": dict(cookies)}, member_id)


def pool_health(client: redis.Redis, settings: Settings) -> list[PoolHealth]:
    """monitor.health source: the cookie pools as PoolHealth records."""
    return health_records(client, settings.key_prefix, KIND)


providers.add(KIND, lambda site, platform: CookieProvider(site, platform))
