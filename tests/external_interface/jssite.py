"""A small JavaScript site of the browser tests' own, on a free port, always stopped.

Pages (each counts its hits in `site.hits[path]`):

- `/static`: a plain page, `<h1>` and nothing that ever comes later;
- `/xhr?api=/api/slow&ms=N`: its script fetches `api` and then shows `.late`; with
  `/api/hang` the answer never comes, with `/api/fail` it is a 500 and the page shows an error;
- `/scroll?batches=K&size=S&ms=N`: infinite scroll, S items (`li.item`) at first and S more
  per scroll from `/api/batch?i=...` answering after N ms, K batches in all (then nothing);
  `&hang=1` makes the second batch's answer never come;
- `/hang`: a document that never finishes loading.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

STATIC = (
    "<!doctype html><html><head><title>static</title></head><body><h1>static</h1></body></html>"
)
XHR = """<!doctype html><html><head><title>xhr</title></head><body><div id="out">loading</div>
<script>
fetch(%(api)s).then(r => { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
  .then(d => { const p = document.createElement('p'); p.className = 'late'; p.textContent = d.text;
               document.body.appendChild(p); })
  .catch(e => { document.getElementById('out').textContent = 'error: ' + e.message; });
</script></body></html>"""
SCROLL = """<!doctype html><html><head><title>scroll</title>
<style>li.item { height: 400px; }</style></head><body><ul id="list"></ul>
<script>
const size = %(size)d, batches = %(batches)d, ms = %(ms)d, hang = %(hang)d;
let next = 0, loading = false;
function add(items) { const ul = document.getElementById('list');
  for (const t of items) { const li = document.createElement('li'); li.className = 'item';
    li.textContent = t; ul.appendChild(li); } }
function more() {
  if (loading || next >= batches) return;
  loading = true;
  const i = next;
  fetch('/api/batch?i=' + i + '&size=' + size + '&ms=' + ms + (hang && i == 1 ? '&hang=1' : ''))
    .then(r => r.json()).then(d => { add(d.items); next = i + 1; loading = false; });
}
add(Array.from({length: size}, (_, k) => 'first-' + k)); next = 1;
window.addEventListener('scroll', () => {
  if (window.innerHeight + window.scrollY >= document.body.scrollHeight - 50) more();
});
</script></body></html>"""


class JsSite:
    """The site on 127.0.0.1 and a free port; `url(path)` is a page's address."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.stopping = threading.Event()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(parts.query).items()}
                site.hits[parts.path] += 1
                site.answer(self, parts.path, q)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path

    def start(self) -> JsSite:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> JsSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _hang(self) -> None:
        self.stopping.wait(120)

    def answer(self, h: BaseHTTPRequestHandler, path: str, q: dict[str, str]) -> None:
        if path == "/static":
            return _send(h, 200, STATIC)
        if path == "/xhr":
            return _send(
                h,
                200,
                XHR % {"api": json.dumps(q.get("api", "/api/slow") + "?ms=" + q.get("ms", "0"))},
            )
        if path == "/scroll":
            args = {
                k: int(q.get(k, d))
                for k, d in (("size", 5), ("batches", 3), ("ms", 0), ("hang", 0))
            }
            return _send(h, 200, SCROLL % args)
        if path == "/hang":
            h.send_response(200)
            h.send_header("Content-Type", "text/html")
            h.end_headers()
            h.wfile.write(b"<!doctype html><html><body><p id='hang'>still loading")
            h.wfile.flush()
            return self._hang()
        if path == "/api/slow":
            time.sleep(int(q.get("ms", "0")) / 1000)
            return _send(h, 200, json.dumps({"text": "late"}), "application/json")
        if path == "/api/hang":
            return self._hang()
        if path == "/api/fail":
            return _send(h, 500, json.dumps({"error": "down"}), "application/json")
        if path == "/api/batch":
            if q.get("hang"):
                return self._hang()
            time.sleep(int(q.get("ms", "0")) / 1000)
            i, size = int(q["i"]), int(q["size"])
            return _send(h, 200, json.dumps({"items": [f"b{i}-{k}" for k in range(size)]}),
                         "application/json")  # fmt: skip
        return _send(h, 404, "not found", "text/plain")


def _send(h: BaseHTTPRequestHandler, status: int, body: str, ctype: str = "text/html") -> None:
    data = body.encode()
    h.send_response(status)
    h.send_header("Content-Type", f"{ctype}; charset=utf-8")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("Cache-Control", "no-store")
    h.end_headers()
    h.wfile.write(data)
