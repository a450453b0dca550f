"""The TLS ClientHello as the guard sees it, read before the handshake: the traits a browser's
handshake has and OpenSSL's (urllib3, requests) lacks.

Chrome and Safari put GREASE values (RFC 8701: 0x0a0a, 0x1a1a, ... 0xfafa) among their cipher
suites and extensions; Firefox sends none but announces `record_size_limit` (RFC 8449), which
OpenSSL's clients never send. Chrome shuffles its extensions on every connection, so their
order proves nothing: the guard looks at what is there, not where.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECORD_SIZE_LIMIT = 28
ALPN = 16
SUPPORTED_VERSIONS = 43


def is_grease(value: int) -> bool:
    return (value & 0x0F0F) == 0x0A0A and (value >> 8) == (value & 0xFF)


@dataclass
class Hello:
    """What one ClientHello offered."""

    ciphers: list[int] = field(default_factory=list)
    extensions: list[int] = field(default_factory=list)
    alpn: list[str] = field(default_factory=list)

    @property
    def grease(self) -> bool:
        return any(is_grease(v) for v in self.ciphers + self.extensions)

    @property
    def record_size_limit(self) -> bool:
        return RECORD_SIZE_LIMIT in self.extensions

    def summary(self) -> str:
        return (
            f"grease={self.grease} record_size_limit={self.record_size_limit} "
            f"ciphers={len(self.ciphers)} extensions={len(self.extensions)} alpn={self.alpn}"
        )


def record_length(data: bytes) -> int | None:
    """Bytes the first TLS record needs (header included), or None if `data` is no handshake
    record. Fewer than 5 bytes: 5, to read the header."""
    if len(data) < 5:
        return 5
    if data[0] != 0x16:
        return None
    return 5 + int.from_bytes(data[3:5], "big")


def parse_hello(data: bytes) -> Hello | None:
    """The ClientHello in the first handshake record, or None when it is not one (or cut)."""
    try:
        if record_length(data) is None or data[5] != 1:
            return None
        p = 9 + 2 + 32  # record header, handshake header, client version, random
        p += 1 + data[p]  # session id
        n = int.from_bytes(data[p : p + 2], "big")
        ciphers = [int.from_bytes(data[i : i + 2], "big") for i in range(p + 2, p + 2 + n, 2)]
        p += 2 + n
        p += 1 + data[p]  # compression methods
        end = p + 2 + int.from_bytes(data[p : p + 2], "big")
        p += 2
        hello = Hello(ciphers=ciphers)
        while p + 4 <= end:
            kind = int.from_bytes(data[p : p + 2], "big")
            size = int.from_bytes(data[p + 2 : p + 4], "big")
            body = data[p + 4 : p + 4 + size]
            hello.extensions.append(kind)
            if kind == ALPN and len(body) >= 2:
                q = 2
                while q < len(body):
                    ln = body[q]
                    hello.alpn.append(body[q + 1 : q + 1 + ln].decode("latin-1"))
                    q += 1 + ln
            p += 4 + size
        return hello
    except IndexError:
        return None
