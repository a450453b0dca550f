"""The frames the browser pool and its driver exchange over their Unix socket.

One frame: a 4-byte big-endian header length, a JSON header, then the header's binary parts
(`"blobs": [len, ...]`) back to back. Pages and screenshots travel as raw bytes, not base64
inside JSON, so a 1 MB DOM costs a copy, not an encode and a parse. The worker side uses a
blocking socket (cooperative once gevent patched `socket`), the driver asyncio streams.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

_LEN = struct.Struct(">I")
MAX_HEADER = 16 * 1024 * 1024
MAX_BLOBS = 512 * 1024 * 1024


class WireError(Exception):
    """The other side sent something that is not a frame, or hung up in the middle of one."""


def encode(header: Mapping[str, Any], blobs: Sequence[bytes] = ()) -> list[bytes]:
    head = orjson.dumps({**header, "blobs": [len(b) for b in blobs]})
    return [_LEN.pack(len(head)), head, *blobs]


def _parse_header(raw: bytes) -> tuple[dict[str, Any], list[int]]:
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"bad frame header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("bad frame header: not a JSON object")
    sizes = header.pop("blobs", [])
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise WireError("bad frame header: blobs must be a list of sizes")
    if sum(sizes) > MAX_BLOBS:
        raise WireError(f"frame too large: {sum(sizes)} bytes")
    return header, sizes


def _check_len(n: int) -> int:
    if n > MAX_HEADER:
        raise WireError(f"frame header too large: {n} bytes")
    return n


# --- blocking sockets (the worker side) ------------------------------------------------------
def send(sock: socket.socket, header: Mapping[str, Any], blobs: Sequence[bytes] = ()) -> None:
    sock.sendall(b"".join(encode(header, blobs)))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise WireError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[bytes]]:
    (n,) = _LEN.unpack(_recv_exactly(sock, _LEN.size))
    header, sizes = _parse_header(_recv_exactly(sock, _check_len(n)))
    return header, [_recv_exactly(sock, size) for size in sizes]


# --- asyncio streams (the driver side) ------------------------------------------------------
async def write(
    writer: asyncio.StreamWriter, header: Mapping[str, Any], blobs: Sequence[bytes] = ()
) -> None:
    writer.writelines(encode(header, blobs))
    await writer.drain()


async def read(reader: asyncio.StreamReader) -> tuple[dict[str, Any], list[bytes]]:
    try:
        (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
        header, sizes = _parse_header(await reader.readexactly(_check_len(n)))
        return header, [await reader.readexactly(size) for size in sizes]
    except asyncio.IncompleteReadError as exc:
        raise WireError(f"connection closed after {len(exc.partial)} bytes") from None
