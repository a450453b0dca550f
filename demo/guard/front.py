"""The guarded front: the demo platform over TLS and HTTP/2, behind a browser check.

aiohttp speaks neither HTTP/2 nor lets a handler see the TLS ClientHello, so the front is a
small server of its own in the demo's process (and event loop), built on the `h2` protocol
library: it accepts a connection, reads the ClientHello before the handshake (peeking, so the
TLS layer still gets it whole), completes TLS with ALPN `h2` and `http/1.1`, and answers each
request either `403 {"error": "fingerprint", "reason": ...}` or, when it looks like the
browser its user agent names (`verdict.py`), with what the platform itself answers (the
request forwarded over loopback, the answer passed back as it came). An HTTP/1.1 connection
gets the 403 at once: no browser speaks HTTP/1.1 to a server that offers HTTP/2.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import h2.config
import h2.connection
import h2.events
import h2.exceptions

from demo.guard.hello import Hello, parse_hello, record_length
from demo.guard.verdict import judge

log = logging.getLogger("demo.guard")

HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "host",
        "te",
        "content-length",
    )
)
HELLO_WAIT_S = 10.0
MAX_BODY = 1024 * 1024


@dataclass
class Seen:
    """What the front saw of one request (for its log and the platform's tests)."""

    alpn: str
    hello: str
    verdict: str | None
    user_agent: str = ""
    path: str = ""


@dataclass
class _Stream:
    headers: list[tuple[str, str]]
    body: bytearray = field(default_factory=bytearray)


class GuardFront:
    """TLS + HTTP/2 in front of `backend` (the platform's own URL); `start()` returns the port."""

    def __init__(
        self,
        backend: str,
        ssl_context: ssl.SSLContext,
        host: str = "127.0.0.1",
        port: int = 0,
        on_seen: Callable[[Seen], None] | None = None,
    ) -> None:
        self.backend = backend.rstrip("/")
        self.ctx = ssl_context
        self.ctx.set_alpn_protocols(["h2", "http/1.1"])
        self.host, self.port = host, port
        self.on_seen = on_seen
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> int:
        sock = socket.create_server((self.host, self.port), backlog=1024, reuse_port=False)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._task = asyncio.create_task(self._accept())
        return self.port

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
        if self._session is not None:
            await self._session.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            task = asyncio.create_task(self._connection(conn))
            self._conns.add(task)
            task.add_done_callback(self._conns.discard)

    async def _connection(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        writer: asyncio.StreamWriter | None = None
        try:
            hello = await asyncio.wait_for(_peek_hello(conn), HELLO_WAIT_S)
            reader = asyncio.StreamReader(limit=2**20)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(
                lambda: protocol, sock=conn, ssl=self.ctx, ssl_handshake_timeout=HELLO_WAIT_S
            )
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            tls = writer.get_extra_info("ssl_object")
            alpn = (tls.selected_alpn_protocol() if tls is not None else None) or "http/1.1"
            if alpn == "h2":
                await _H2(self, reader, writer, hello).run()
            else:
                await self._http1(reader, writer, hello)
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            else:
                conn.close()

    async def _http1(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: Hello | None
    ) -> None:
        """One request read, refused (no browser speaks HTTP/1.1 here), the connection closed."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers = [tuple(x.strip() for x in ln.split(":", 1)) for ln in lines[1:] if ":" in ln]
        ua = next((v for k, v in headers if k.lower() == "user-agent"), "")
        reason = judge(hello, None, headers)  # type: ignore[arg-type]
        self._saw(
            Seen(
                "http/1.1",
                hello.summary() if hello else "",
                reason,
                ua,
                parts[1] if len(parts) > 1 else "",
            )
        )
        body = json.dumps({"error": "fingerprint", "reason": reason}).encode()
        writer.write(
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    def _saw(self, seen: Seen) -> None:
        log.info("guard %s %s %s: %s", seen.alpn, seen.path, seen.hello, seen.verdict or "browser")
        if self.on_seen is not None:
            self.on_seen(seen)

    async def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The platform's own answer to the request."""
        assert self._session is not None
        send = [(k, v) for k, v in headers if not k.startswith(":") and k not in HOP_BY_HOP]
        async with self._session.request(
            method, self.backend + path, headers=send, data=body or None, allow_redirects=False
        ) as resp:
            content = await resp.read()
            out = [(k.lower(), v) for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP]
            return resp.status, out, content


async def _peek_hello(conn: socket.socket) -> Hello | None:
    """The first TLS record, read with MSG_PEEK so the handshake still reads it all."""
    loop = asyncio.get_running_loop()
    conn.setblocking(False)
    want = 5
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(conn.fileno(), _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(conn.fileno())
        data = conn.recv(max(want, 16384), socket.MSG_PEEK)
        if not data:
            raise ConnectionError("closed before its ClientHello")
        need = record_length(data)
        if need is None:
            return None
        if len(data) >= need:
            return parse_hello(data[:need])
        want = need
        await asyncio.sleep(0.005)  # the rest of the record is on its way


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class _H2:
    """One HTTP/2 connection: the client's SETTINGS, each request judged and answered."""

    def __init__(
        self,
        front: GuardFront,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        hello: Hello | None,
    ) -> None:
        self.front, self.reader, self.writer, self.hello = front, reader, writer, hello
        cfg = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=cfg)
        self.settings: dict[int, int] = {}
        self.streams: dict[int, _Stream] = {}
        self.window = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        self.conn.initiate_connection()
        await self.flush()
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                for event in self.conn.receive_data(data):
                    self.handle(event)
                await self.flush()
        finally:
            for t in list(self.tasks):
                t.cancel()

    def handle(self, event: Any) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged) and not self.settings:
            self.settings = {int(k): v.new_value for k, v in event.changed_settings.items()}
            self.settings.setdefault(4, 65535)
        elif isinstance(event, h2.events.RequestReceived):
            headers = cast("list[tuple[str, str]]", event.headers)  # header_encoding: text
            self.streams[event.stream_id] = _Stream(list(headers))
        elif isinstance(event, h2.events.DataReceived):
            s = self.streams.get(event.stream_id)
            if s is not None and len(s.body) < MAX_BODY:
                s.body += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            s = self.streams.pop(event.stream_id, None)
            if s is not None:
                task = asyncio.create_task(self.answer(event.stream_id, s))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        elif isinstance(event, h2.events.WindowUpdated):
            self.window.set()
        elif isinstance(event, h2.events.StreamReset):
            self.streams.pop(event.stream_id, None)

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def answer(self, sid: int, s: _Stream) -> None:
        pseudo = dict((k, v) for k, v in s.headers if k.startswith(":"))
        ua = next((v for k, v in s.headers if k == "user-agent"), "")
        path = pseudo.get(":path", "/")
        reason = judge(self.hello, self.settings, s.headers)
        self.front._saw(Seen("h2", self.hello.summary() if self.hello else "", reason, ua, path))
        if reason is not None:
            body = json.dumps({"error": "fingerprint", "reason": reason}).encode()
            status, headers = 403, [("content-type", "application/json")]
        else:
            try:
                status, headers, body = await self.front.forward(
                    pseudo.get(":method", "GET"), path, s.headers, bytes(s.body)
                )
            except aiohttp.ClientError as exc:
                body = json.dumps({"error": "upstream", "reason": str(exc)}).encode()
                status, headers = 502, [("content-type", "application/json")]
        out = [(":status", str(status)), *headers, ("content-length", str(len(body)))]
        try:
            self.conn.send_headers(sid, out, end_stream=not body)
            await self.flush()
            await self.send_body(sid, body)
        except h2.exceptions.StreamClosedError:
            pass

    async def send_body(self, sid: int, body: bytes) -> None:
        """The body within the client's flow-control windows."""
        view = memoryview(body)
        while view:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                self.window.clear()
                await self.window.wait()
                continue
            chunk, view = view[:room], view[room:]
            self.conn.send_data(sid, bytes(chunk), end_stream=not view)
            await self.flush()
