"""The small HTTP servers of the fetch layer's tests: `serving(Handler)` runs one on a free
port of 127.0.0.1 in a daemon thread and gives its URL (https with `tls`); `Echo` answers
with what it received."""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Echo(BaseHTTPRequestHandler):
    """Answers with what it received (request line, headers, body) as JSON; `/hop/N` redirects
    N more times before landing on `/echo`; also serves as an HTTP proxy (absolute URIs).
    Bodies for the size limit and charsets: `/chunked?n=N`, N bytes with no Content-Length;
    `/gzip?n=N`, N bytes gzipped, a few hundred on the wire; `/declared`, a Content-Length of
    1 GB, then nothing; `/charset`, GBK text whose charset only its Content-Type names."""

    protocol_version = "HTTP/1.1"  # chunked bodies

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = (
            self.path.split("://", 1)[-1].partition("/")[2] if "://" in self.path else self.path[1:]
        )
        name, _, query = path.partition("?")
        if name in ("chunked", "gzip", "declared", "charset"):
            self._body(name, int(query.removeprefix("n=") or 0))
            return
        if path.startswith("hop/"):
            n = int(path.split("/")[1].split("?")[0])
            self.send_response(302)
            self.send_header("Location", f"/hop/{n - 1}" if n > 1 else "/echo")
            self.send_header("Set-Cookie", "stored=never; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        out = json.dumps({
            "method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("latin-1"),
        }).encode()  # fmt: skip
        self.send_response(int(self.headers.get("X-Status") or 200))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def _body(self, name: str, n: int) -> None:
        self.send_response(200)
        if name == "declared":
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.flush()
            time.sleep(5)  # the body never comes: a fetcher must refuse it on the header
            self.close_connection = True
            return
        if name == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, n, 16384):
                part = b"b" * min(16384, n - i)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        if name == "gzip":
            out = gzip.compress(b"a" * n)
            self.send_header("Content-Encoding", "gzip")
        else:
            out = "<p>中文标题</p>".encode("gbk")
            self.send_header("Content-Type", "text/html; charset=GBK")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a: Any) -> None:
        pass
