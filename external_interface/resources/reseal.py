"""Re-seal every secret kept in Redis with the current sealing key: the second step of a key
rotation (docs/security.md), and the way to seal values an older deployment stored in clear.

    python -m external_interface.resources.reseal                 # after putting a new key in front
    python -m external_interface.resources.reseal --adopt-clear   # also seal values stored in clear

Visits the places secrets live (`SEALED`): each value that opens only with an older key is
sealed again with the first; with `--adopt-clear`, a value that is no Fernet token at all is
taken as clear text and sealed. Each write replaces the value only if it is still the one read
(`reseal.lua`), so workers may run meanwhile. Values no key opens are counted and left alone
(their pool retires them at their next checkout). Nothing secret is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import redis

from config import get_settings
from exceptions import SecretUnreadable
from external_interface.resources.proxy.pool import ProxyKeys
from utils.keyspace import Keyspace
from utils.lua import script
from utils.redis import as_str, get_redis
from utils.seal import MAGIC, Sealer, get_sealer

RESEAL = script(__file__, "reseal.lua")


def sealed_patterns(prefix: str) -> dict[str, str]:
    """Where secrets live, by what they are: key patterns (hashes of secrets, vault strings)."""
    proxy = ProxyKeys(prefix)
    return {
        # cookies, devices (external_interface.resources.pool) of every site: `{*}` matches any site's tag
        "pool members": f"{Keyspace(prefix).pool('*', '*')}:secret",
        "proxy URLs": proxy.url,
        "proxy channel URLs": f"{proxy.channel('*')}:url",
        "vault tickets": f"{prefix}:vault:*",
    }


@dataclass
class Tally:
    current: int = 0
    resealed: int = 0
    adopted: int = 0
    unreadable: int = 0
    changed_meanwhile: int = 0
    keys: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, int]:
        out = {k: v for k, v in vars(self).items() if isinstance(v, int)}
        return {**out, "keys": len(self.keys)}


def _values(r: redis.Redis, key: bytes) -> Iterator[tuple[str, bytes]]:
    """(field, value) of a hash of secrets, or ("", value) of a string."""
    kind = r.type(key)
    if kind == b"hash":
        for f, v in r.hscan_iter(key):
            yield as_str(f), cast(bytes, v)
    elif kind == b"string":
        v = cast("bytes | None", r.get(key))
        if v is not None:
            yield "", v


def _clear_text(value: bytes) -> str | None:
    """`value` as clear text, unless it is a token (sealed with a key we lack)."""
    if value.startswith(MAGIC):
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def reseal(
    r: redis.Redis, prefix: str, box: Sealer, adopt_clear: bool = False
) -> dict[str, dict[str, int]]:
    """Seal every stored secret with `box`'s sealing key; -> counts per place."""
    cas = r.register_script(RESEAL)
    out = {}
    for what, pattern in sealed_patterns(prefix).items():
        t = Tally()
        for key in r.scan_iter(match=pattern, count=500):
            t.keys.add(as_str(key))
            for fld, value in _values(r, key):
                if box.is_current(value):
                    t.current += 1
                    continue
                try:
                    new, counter = box.reseal(value), "resealed"
                except SecretUnreadable:
                    clear = _clear_text(value) if adopt_clear else None
                    if clear is None:
                        t.unreadable += 1
                        continue
                    new, counter = box.seal(clear), "adopted"
                if int(cas(keys=[key], args=[fld, value, new])):
                    setattr(t, counter, getattr(t, counter) + 1)
                else:
                    t.changed_meanwhile += 1
        out[what] = t.as_dict()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m external_interface.resources.reseal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--adopt-clear",
        action="store_true",
        help="seal values stored in clear (by a deployment before sealing)",
    )
    args = p.parse_args(argv)
    s = get_settings()
    counts = reseal(get_redis(), s.key_prefix, get_sealer(s), adopt_clear=args.adopt_clear)
    print(json.dumps(counts, indent=2))
    return 1 if any(c["unreadable"] for c in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
