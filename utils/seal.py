"""Secrets sealed at rest: what Redis keeps of a session cookie, a device id, a proxy's
credentials or a vault ticket is a sealed token, so an append-only file, an RDB dump or a copy
of `var/redis/` shows none of them.

    box = get_sealer()                 # this process's keys (config: SECRET_KEY / its file)
    token = box.seal('{"cookies": ...}')
    box.open(token)                    # -> the text; SecretUnreadable if no key opens it

A token is `cc1` + the sealing key's id (4 bytes of its SHA-256: not secret) + a random
96-bit nonce + the text encrypted and authenticated with AES-256-GCM (`cryptography`'s
AESGCM): tampering or a wrong key is detected, never decoded into garbage. A checkout opens
one secret: about 1 µs of CPU alone, a median of 6 µs inside a checkout (cold caches), where
a Fernet token costs 36 µs (bench/seal_bench.py; docs/security.md).

The keys come from `Settings.sealing_keys()`: the first seals, every one opens (the key id
picks it), so a key is rotated by putting a new one in front, re-sealing what is stored
(`python -m external_interface.resources.reseal`) and then dropping the old one (docs/security.md).
A key is 32 random bytes, URL-safe base64: `python -m utils.seal` prints a new one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from config import Settings, get_settings
from exceptions import ConfigError, SecretUnreadable
from utils.secretfile import new_key

MAGIC = b"cc1"
KID = 4  # bytes of key id
NONCE = 12
HEAD = len(MAGIC) + KID + NONCE


def _key_bytes(key: str | bytes) -> bytes:
    text = key.decode() if isinstance(key, bytes) else key
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ConfigError(
            "CHAINCRAWL_SECRET_KEY (or its file) holds a key that is not 32 bytes of URL-safe "
            "base64 (make one with `python -m utils.seal`)"
        )
    return raw


def key_id(key: str | bytes) -> str:
    """A key's public id (hex): the first bytes of its SHA-256, as tokens carry it."""
    return hashlib.sha256(_key_bytes(key)).digest()[:KID].hex()


class Sealer:
    """Seals text with the first of `keys`, opens tokens sealed with any of them."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if not keys:
            raise ConfigError("no sealing key: set CHAINCRAWL_SECRET_KEY or SECRET_KEY_FILE")
        self._aeads: dict[bytes, AESGCM] = {}
        for k in keys:
            raw = _key_bytes(k)
            self._aeads.setdefault(hashlib.sha256(raw).digest()[:KID], AESGCM(raw))
        self._kid = hashlib.sha256(_key_bytes(keys[0])).digest()[:KID]
        self._aead = self._aeads[self._kid]
        self._prefix = MAGIC + self._kid

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys, the sealing one first (for messages: ids are not secret)."""
        return [self._kid.hex(), *(k.hex() for k in self._aeads if k != self._kid)]

    def seal(self, text: str) -> bytes:
        nonce = os.urandom(NONCE)
        return self._prefix + nonce + self._aead.encrypt(nonce, text.encode(), None)

    def open(self, token: bytes | str, what: str = "a secret") -> str:
        """The text sealed in `token`; `what` names the value in the error."""
        data = token.encode() if isinstance(token, str) else token
        aead = self._aeads.get(data[3 : HEAD - NONCE]) if data[:3] == MAGIC else None
        if aead is not None:
            try:
                return aead.decrypt(data[HEAD - NONCE : HEAD], data[HEAD:], None).decode()
            except InvalidTag:
                pass
        raise SecretUnreadable(
            f"{what} kept in Redis cannot be opened with this process's keys "
            f"({', '.join(self.key_ids)}): {self._why(data)} "
            "(docs/security.md)"
        )

    def _why(self, data: bytes) -> str:
        kid = data[3 : HEAD - NONCE]
        if data[:3] != MAGIC:
            return "it was stored in clear"
        if kid in self._aeads:
            return "it was altered"
        return (
            f"it was sealed with key {kid.hex()}; every process sharing a Redis needs the "
            "same CHAINCRAWL_SECRET_KEY"
        )

    def is_current(self, token: bytes) -> bool:
        """Whether `token` is sealed with the sealing key (needs no re-sealing after a rotation)."""
        return token.startswith(self._prefix)

    def reseal(self, token: bytes) -> bytes:
        """`token`'s text sealed again with the sealing key."""
        return self.seal(self.open(token))


_lock = threading.Lock()
_sealers: dict[tuple[str, str], Sealer] = {}


def get_sealer(settings: Settings | None = None) -> Sealer:
    """The sealer of `settings`' keys (this process's settings by default): built once per
    key source, so the page path reads no file."""
    s = settings or get_settings()
    source = (s.secret_key, str(s.sealing_key_file))
    box = _sealers.get(source)
    if box is None:
        with _lock:
            box = _sealers.get(source)
            if box is None:
                box = _sealers[source] = Sealer(s.sealing_keys())
    return box


def reset_sealers() -> None:
    """Forget built sealers (tests that replace a key file call this)."""
    with _lock:
        _sealers.clear()


if __name__ == "__main__":
    print(new_key())
