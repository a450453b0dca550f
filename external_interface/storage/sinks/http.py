"""HTTP API sink: items POSTed as JSON in batches, retried with exponential backoff.

Body of each POST (at most `batch` items):

    {"type": "demo.post", "key_fields": ["post_id"], "items": [{...}, ...],
     "origins": [{"entry": "1700000000000-0", "run": "...", "step": "...", "task": "..."}, ...]}

with the header `Idempotency-Key` (a hash of the type and the items' entry ids and keys, the
same for the same chunk on every retry). Exactly once needs the receiver's help, as with any
HTTP API: it must upsert by the key fields (or remember idempotency keys). The sink retries a
chunk `retries` times on connection errors, timeouts, 408, 425, 429 and 5xx (honouring a short
Retry-After), then raises `SinkError` and the drainer retries the whole entry later. 400, 413 and
422 mean the data itself was refused: `PermanentSinkError`, and the entry is dead-lettered
after being retried on its own.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
import requests

from exceptions import ConfigError
from external_interface.storage.sinks.base import (
    Origin,
    PermanentSinkError,
    SinkError,
    key_values,
)
from settings.storage import get_storage_settings

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset((408, 425, 429, 500, 502, 503, 504))
PERMANENT_STATUS = frozenset((400, 413, 422))


class HttpSink:
    """Batched JSON POSTs to one URL."""

    name = "http"

    def __init__(
        self,
        url: str,
        *,
        token: str = "",
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        batch: int = 500,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not url:
            raise ConfigError("the http sink needs CHAINCRAWL_HTTP_SINK_URL")
        self.url = url
        self.timeout = timeout
        self.retries = max(1, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.batch = batch
        self.session = requests.Session()
        self.session.headers["Content-Type"] = "application/json"
        self.session.headers["User-Agent"] = "chaincrawl-sink/1"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.headers.update(headers or {})

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpSink:
        ss = get_storage_settings()
        return cls(
            ss.http_sink_url,
            token=ss.http_sink_token,
            timeout=ss.http_sink_timeout,
            retries=ss.http_sink_retries,
            batch=ss.http_sink_batch,
        )

    def write(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        *,
        origins: Sequence[Origin] | None = None,
    ) -> None:
        origins = list(origins) if origins is not None else [Origin()] * len(items)
        for start in range(0, len(items), self.batch):
            chunk, chunk_origins = (
                items[start : start + self.batch],
                origins[start : start + self.batch],
            )
            body, idem = self._encode(item_type, key_fields, chunk, chunk_origins)
            self._post(body, idem, item_type)

    def close(self) -> None:
        self.session.close()

    def _encode(
        self,
        item_type: str,
        key_fields: list[str],
        items: list[dict[str, Any]],
        origins: list[Origin],
    ) -> tuple[bytes, str]:
        keys = [key_values(item, key_fields) for item in items]
        try:
            body = orjson.dumps(
                {
                    "type": item_type,
                    "key_fields": key_fields,
                    "items": items,
                    "origins": [
                        {"entry": o.entry, "run": o.run, "step": o.step, "task": o.task}
                        for o in origins
                    ],
                },
                option=orjson.OPT_NON_STR_KEYS,
            )
            ident = orjson.dumps([item_type, [o.entry for o in origins], keys], default=str)
        except TypeError as e:
            raise PermanentSinkError(f"http: item is not JSON-serialisable: {e}", self.name) from e
        return body, hashlib.sha256(ident).hexdigest()[:32]

    def _post(self, body: bytes, idem: str, item_type: str) -> None:
        last = ""
        for attempt in range(self.retries):
            wait = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
            try:
                resp = self.session.post(
                    self.url, data=body, headers={"Idempotency-Key": idem}, timeout=self.timeout
                )
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 300:
                    return
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code in PERMANENT_STATUS:
                    raise PermanentSinkError(f"http {item_type}: {last}", self.name)
                if resp.status_code not in RETRY_STATUS:
                    break  # 401/403/404...: configuration; retried by the drainer, not here
                retry_after = resp.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    wait = min(self.max_backoff, float(retry_after))
            if attempt + 1 < self.retries:
                log.info("http sink: %s; retrying in %.2fs", last, wait)
                time.sleep(wait)
        raise SinkError(f"http {item_type}: {last}", self.name)
