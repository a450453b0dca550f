"""The dead-letter store: tasks that failed for good, with parameters, error and traceback.

Kept in Redis (`deadletter` hash id -> JSON, `deadletter:index` sorted by time) so any machine
can list and replay them. The entry id is the task id, so recording the same failure twice
(a redelivered message) keeps one entry. Parameters are stored as the task received them;
endpoints never receive secrets as parameters (resources are lent by providers), so nothing
secret is kept here.

A rendered page that failed (`exceptions.PageCapture`: a timeout, a crash, a refused page)
leaves what it showed: its screenshot (PNG) and DOM go to files under
`VAR_DIR/captures/<dead-letter id>/` on the worker's machine, and the record names them
(`capture`: directory, host, files and sizes). Files, not Redis: a screenshot is for opening
in an image viewer, and a broken site failing thousands of pages must not fill the state
store. The newest `CHAINCRAWL_BROWSER_CAPTURES` directories are kept, each file at most
`CHAINCRAWL_BROWSER_CAPTURE_MAX_KB` (a longer DOM is cut, a larger screenshot left out).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import redis

from config import Settings, get_settings
from exceptions import PageCapture
from settings.browser import BrowserSettings, get_browser_settings

CAPTURES = "captures"  # under VAR_DIR
SCREENSHOT = "screenshot.png"
DOM = "dom.html"


@dataclass
class DeadLetter:
    id: str
    task: str
    params: dict[str, Any]
    meta: dict[str, Any]
    error_type: str
    error: str
    traceback: str
    retries: int
    failed_at: float = field(default_factory=time.time)
    capture: dict[str, Any] | None = None  # a failed render's screenshot and DOM (files)


def keep_capture(
    exc: BaseException,
    dl_id: str,
    var_dir: Path,
    browser: BrowserSettings | None = None,
) -> dict[str, Any] | None:
    """Write a failed render's screenshot and DOM under `var_dir/captures/<dl_id>/` and
    return what the dead letter records of them; None when `exc` carries no capture (or
    captures are off). A disk that refuses is noted in the record, never raised: the dead
    letter matters more than its picture."""
    if not isinstance(exc, PageCapture) or not (exc.screenshot or exc.dom):
        return None
    b = browser or get_browser_settings()
    if b.captures <= 0:
        return None
    limit = b.capture_max_kb * 1024
    root = Path(var_dir) / CAPTURES
    where = root / dl_id
    record: dict[str, Any] = {
        "dir": str(where),
        "host": socket.gethostname(),
        "page_url": exc.page_url,
        "files": {},
    }
    try:
        where.mkdir(parents=True, exist_ok=True)
        if exc.screenshot and len(exc.screenshot) <= limit:
            (where / SCREENSHOT).write_bytes(exc.screenshot)
            record["files"][SCREENSHOT] = len(exc.screenshot)
        elif exc.screenshot:
            record["screenshot_left_out"] = len(exc.screenshot)
        if exc.dom:
            dom = exc.dom.encode("utf-8", "replace")
            (where / DOM).write_bytes(dom[:limit])
            record["files"][DOM] = min(len(dom), limit)
            if len(dom) > limit:
                record["dom_cut_from"] = len(dom)
        _prune(root, b.captures)
    except OSError as exc2:
        record["error"] = f"{type(exc2).__name__}: {exc2}"[:300]
    return record


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` capture directories."""
    with os.scandir(root) as it:
        dirs = [(e.stat().st_mtime, e.path) for e in it if e.is_dir(follow_symlinks=False)]
    if len(dirs) > keep:
        for _, path in sorted(dirs)[: len(dirs) - keep]:
            shutil.rmtree(path, ignore_errors=True)


def drop_capture(dl: DeadLetter) -> None:
    """Remove a dead letter's capture files, when they are on this machine."""
    cap = dl.capture or {}
    where = cap.get("dir")
    if where and cap.get("host") == socket.gethostname() and Path(where).parent.name == CAPTURES:
        with contextlib.suppress(OSError):
            shutil.rmtree(where)


class DeadLetterStore:
    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.r = client
        s = settings or get_settings()
        self.hash_key = s.key("deadletter")
        self.index_key = s.key("deadletter", "index")

    def add(self, dl: DeadLetter, pipe: Any = None) -> None:
        p = pipe if pipe is not None else self.r.pipeline()
        p.hset(self.hash_key, dl.id, orjson.dumps(asdict(dl)))
        p.zadd(self.index_key, {dl.id: dl.failed_at})
        if pipe is None:
            p.execute()

    def list(
        self, limit: int = 100, task: str | None = None, run: str | None = None
    ) -> list[DeadLetter]:
        """The newest dead letters, of one task and/or one run if given."""
        ids = cast(
            "list[bytes]", self.r.zrevrange(self.index_key, 0, -1 if task or run else limit - 1)
        )
        out: list[DeadLetter] = []
        if not ids:
            return out
        for raw in self.r.hmget(self.hash_key, ids):
            if raw is None:
                continue
            dl = DeadLetter(**orjson.loads(raw))
            if (task is None or dl.task == task) and (run is None or dl.meta.get("run") == run):
                out.append(dl)
            if len(out) >= limit:
                break
        return out

    def get(self, dl_id: str) -> DeadLetter | None:
        raw = self.r.hget(self.hash_key, dl_id)
        return DeadLetter(**orjson.loads(raw)) if raw else None

    def remove(self, dl_id: str) -> bool:
        """Forget a dead letter (a replayed task), its capture files with it."""
        dl = self.get(dl_id)
        if dl is not None:
            drop_capture(dl)
        pipe = self.r.pipeline()
        pipe.hdel(self.hash_key, dl_id)
        pipe.zrem(self.index_key, dl_id)
        return bool(pipe.execute()[0])

    def count(self) -> int:
        return int(self.r.zcard(self.index_key))
