"""Key rotation and adoption: `python -m external_interface.resources.reseal` seals every stored secret
(pool members, proxy URLs, channel copies, vault tickets) with the current key."""

from __future__ import annotations

import json
from typing import cast

import redis

from external_interface.resources import vault
from external_interface.resources.lease import LeasePool
from external_interface.resources.pool import Pool
from external_interface.resources.proxy.channel import ChannelPool
from external_interface.resources.proxy.models import ProxyAddress
from external_interface.resources.proxy.pool import GlobalPool
from external_interface.resources.reseal import reseal
from tests.external_interface.stores import rds_on_both_stores  # noqa: F401 - fixture `rds`
from utils.keyspace import Keyspace
from utils.seal import Sealer
from utils.secretfile import new_key


def test_reseal_moves_every_secret_to_the_new_key_and_adopts_clear_values(
    rds: redis.Redis, key_prefix: str
) -> None:
    old, new = new_key(), new_key()
    before = Sealer([old])
    cookies = Pool("cookie", "shop", rds=rds, prefix=key_prefix, sealer=before)
    cookies.add({"cookies": {"sid": "s-1"}}, "co-1")
    rds.hset(cookies.k_secret, "co-clear", '{"cookies": {"sid": "s-clear"}}')  # stored in clear
    gp = GlobalPool(rds, key_prefix, sealer=before)
    gp.admit(ProxyAddress.parse("http://u:pw@127.0.0.1:3128"), elapsed=0.1)
    ChannelPool("shop", gp).refill()
    ticket = vault.put(
        "device_id",
        "shop",
        {"device_id": "d-1"},
        rds=rds,
        prefix=key_prefix,
        ttl=300,
        sealer=before,
    )
    foreign = LeasePool("thing", "x", Keyspace(key_prefix).pool("thing", "x"), rds=rds,
                        sealer=Sealer([new_key()]))  # fmt: skip
    foreign.add_members([("f-1", "nobody-has-this-key")])

    rotated = Sealer([new, old])
    counts = reseal(rds, key_prefix, rotated)
    homes = {cookies.key_for("secret", "co-1"), cookies.k_secret, foreign.k_secret}
    assert counts["pool members"] == {"current": 0, "resealed": 1, "adopted": 0, "unreadable": 2,
                                      "changed_meanwhile": 0, "keys": len(homes)}  # fmt: skip
    assert counts["proxy URLs"]["resealed"] == counts["proxy channel URLs"]["resealed"] == 1
    assert counts["vault tickets"]["resealed"] == 1
    counts = reseal(rds, key_prefix, rotated, adopt_clear=True)
    assert counts["pool members"]["current"] == 1 and counts["pool members"]["adopted"] == 1
    assert counts["pool members"]["unreadable"] == 1  # sealed with a key nobody has: left alone
    assert counts["proxy URLs"] == {"current": 1, "resealed": 0, "adopted": 0, "unreadable": 0,
                                    "changed_meanwhile": 0, "keys": 1}  # fmt: skip

    after = Sealer([new])  # the old key can go now
    assert json.loads(
        after.open(cast(bytes, rds.hget(cookies.key_for("secret", "co-1"), "co-1")))
    ) == {"cookies": {"sid": "s-1"}}
    assert "s-clear" in after.open(cast(bytes, rds.hget(cookies.k_secret, "co-clear")))
    assert GlobalPool(rds, key_prefix, sealer=after).urls(["127.0.0.1:3128"]) == {
        "127.0.0.1:3128": "http://u:pw@127.0.0.1:3128"
    }
    chan = ChannelPool("shop", GlobalPool(rds, key_prefix, sealer=after))
    lease = chan.checkout()
    assert lease is not None and lease.url == "http://u:pw@127.0.0.1:3128"
    vkey = f"{key_prefix}:vault:device_id:shop:{ticket}"
    assert 0 < rds.ttl(vkey) <= 300  # the ticket keeps its expiry
    assert json.loads(after.open(cast(bytes, rds.get(vkey)))) == {"device_id": "d-1"}
