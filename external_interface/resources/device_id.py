"""Device-id pools per site and the `device_id` provider (pool mechanics: external_interface.resources.pool).

A device is registered once by the site's production chain and then keeps its identity: the
pool stores the device id together with the user agent it registered with, and `prepare`
sets both (the `user_agent` provider runs later and leaves an existing UA alone), so an app
request always pairs a device with its own UA. `feedback` retires devices the site bans
(`device_banned`, `unknown_device` for the demo) and raises BannedError so the task rotates.

Secret layout (JSON in the pool's `:secret` hash): {"device_id", "user_agent", "header"
(default X-Device-Id) or "param" (a query parameter instead), and free-form extras}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from config import Settings
from external_interface.resources.base import OutgoingRequest, providers
from external_interface.resources.health import PoolHealth
from external_interface.resources.pool import Lease, Pool, PoolProvider, health_records

KIND = "device_id"
HEADER = "X-Device-Id"


class DeviceProvider(PoolProvider):
    kind = KIND

    def apply(self, req: OutgoingRequest, lease: Lease) -> None:
        s = lease.secret
        if s.get("param"):
            req.params[s["param"]] = s["device_id"]
        else:
            req.headers[s.get("header") or HEADER] = s["device_id"]
        if s.get("user_agent"):
            for k in [k for k in req.headers if k.lower() == "user-agent"]:
                del req.headers[k]
            req.headers["User-Agent"] = s["user_agent"]


def device_pool(site: str, **kw: Any) -> Pool:
    return Pool(KIND, site, **kw)


def add_device(
    site: str, device: Mapping[str, Any], member_id: str | None = None, **kw: Any
) -> str | None:
    """Put a registered device ({"device_id", "user_agent", ...}) into the site's pool."""
    if not device.get("device_id"):
        raise ValueError("a device needs its device_id")
    return device_pool(site, **kw).add(device, member_id)


def pool_health(client: redis.Redis, settings: Settings) -> list[PoolHealth]:
    """monitor.health source: the device pools as PoolHealth records."""
    return health_records(client, settings.key_prefix, KIND)


providers.add(KIND, lambda site, platform: DeviceProvider(site, platform))
