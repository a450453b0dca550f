"""The dead-letter store: tasks that failed for good, with parameters, error and traceback.

Kept in Redis (`deadletter` hash id -> JSON, `deadletter:index` sorted by time) so any machine
can list and replay them. The entry id is the task id, so recording the same failure twice
(a redelivered message) keeps one entry. Parameters are stored as the task received them;
endpoints never receive secrets as parameters (resources are lent by providers), so nothing
secret is kept here.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import redis

from config import Settings, get_settings


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
        ids = self.r.zrevrange(self.index_key, 0, -1 if task or run else limit - 1)
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
        pipe = self.r.pipeline()
        pipe.hdel(self.hash_key, dl_id)
        pipe.zrem(self.index_key, dl_id)
        return bool(pipe.execute()[0])

    def count(self) -> int:
        return int(self.r.zcard(self.index_key))
