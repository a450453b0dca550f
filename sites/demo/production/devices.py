"""The demo's device production chain (demo/README.md 8.4), on the `resources` queue:

    demo.device.register -> demo.device.add

Registration picks a device profile, derives the app UA from it and registers with that UA
(signed, as every app request must be when `sign` is on). The device id and its UA go to the
vault together, so the pool can pair them on every later request.
"""

from __future__ import annotations

import random

import chains
from base_task import Context, Outputs, endpoint
from exceptions import ParseError
from external_interface.resources import vault
from external_interface.resources.pool import Pool, register_producer
from sites.demo import base_url
from sites.demo.production.profile import (
    APP_VERSIONS,
    DEVICE_HEADER,
    DEVICE_PROFILES,
    SITE,
    app_user_agent,
)
from sites.production import (
    QUEUE,
    PoolEntry,
    ProduceParams,
    Ticket,
    TicketParams,
    chain_producer,
)


@endpoint(
    ProduceParams,
    items=[Ticket],
    name="demo.device.register",
    queue=QUEUE,
    resources={"sign": "sign"},
)
def device_register(ctx: Context, p: ProduceParams) -> Outputs:
    """Register a new device; its id and UA wait in the vault."""
    model, os_name = random.choice(DEVICE_PROFILES)
    ua = app_user_agent(model, os_name, random.choice(APP_VERSIONS))
    resp = ctx.post(
        f"{base_url()}/app/api/device/register",
        json={"model": model, "os": os_name},
        headers={"User-Agent": ua},
    )
    body = resp.json()
    device_id = body.get("device_id") or (body.get("data") or {}).get("device_id")
    if not device_id:
        raise ParseError("device registration answered without a device_id")
    device = {"device_id": device_id, "user_agent": ua, "header": DEVICE_HEADER, "model": model}
    yield Ticket(ticket=vault.put("device_id", SITE, device))


@endpoint(TicketParams, items=[PoolEntry], name="demo.device.add", queue=QUEUE)
def device_add(ctx: Context, p: TicketParams) -> Outputs:
    """Move the device from the vault into the device pool."""
    pool = Pool("device_id", SITE)
    yield PoolEntry(pool=pool.name, member=vault.into_pool(pool, p.ticket))


_Q = {"queue": QUEUE}

DEVICE_CHAIN = chains.define(
    "demo_device_production",
    chains.step("demo.device.register", _options=_Q).then(
        chains.step("demo.device.add", ticket="ticket", _options=_Q)
    ),
)

register_producer("device_id", SITE, chain_producer(DEVICE_CHAIN))
