"""Where a run's records are: the keys of the ledger (docs/architecture.md describes each) and
the reads of what a committed task staged."""

from __future__ import annotations

from typing import Any, cast

import orjson
import redis

from config import Settings, get_settings
from ledger.records import StagedAt, drop_staged
from utils.keyspace import Keyspace
from utils.lua import script
from utils.redis import is_cluster


class RunKeys:
    """A ledger's Redis client, settings and keys (utils/keyspace.py: a run's keys share its
    hash tag, one cluster slot), all in (run, task) order; the scripts registered once."""

    def __init__(self, client: redis.Redis, settings: Settings | None = None) -> None:
        self.r = client
        self.s = settings or get_settings()
        self.ks = Keyspace(self.s.key_prefix)
        # a cluster runs a script only on keys of one slot: the global keys (active runs, the
        # outbox) are then written beside the run's scripts, not by them
        self.cluster = is_cluster(client)
        self._commit = client.register_script(script(__file__, "commit.lua"))
        self._dispatch = client.register_script(script(__file__, "dispatch.lua"))
        self._cancel = client.register_script(script(__file__, "cancel.lua"))
        self._release = client.register_script(script(__file__, "release.lua"))
        self._pause = client.register_script(script(__file__, "pause.lua"))
        self._resume = client.register_script(script(__file__, "resume.lua"))
        self._park = client.register_script(script(__file__, "park.lua"))
        self._compact = client.register_script(script(__file__, "compact.lua"))
        self.ttl = self.s.run_retention  # run records, their counters and bookkeeping

    # keys (utils/keyspace.py: a run's keys share its hash tag, one cluster slot)
    def run_key(self, rid: str) -> str:
        return self.ks.run(rid)

    def counters_key(self, rid: str) -> str:
        return self.ks.counters(rid)

    def wake_key(self, rid: str) -> str:
        """What `wait()` blocks on; the scripts name it `<run hash>:wake` (utils/wake.lua)."""
        return self.ks.wake(rid)

    def done_key(self, rid: str, tid: str) -> str:
        return self.ks.done(rid, tid)

    def kids_key(self, rid: str, tid: str) -> str:
        """A staging list: a client's (`tid` a staging name) in its run's slot, or a task's
        without a run (`rid` "")."""
        return self.ks.kids(rid, tid)

    def staged_key(self, rid: str) -> str:
        return self.ks.staged(rid)

    def staged_at(self, rid: str, tid: str) -> StagedAt:
        """Where the children a commit of `tid` staged wait until sent."""
        if rid:
            return StagedAt(self.staged_key(rid), tid)
        return StagedAt(self.kids_key("", tid), "")

    def staged(self, rid: str, tid: str) -> list[bytes]:
        """The messages of the children a committed task staged and has not sent (read back
        by its redelivery): those of a run still in its ledger, i.e. not committed since."""
        if not rid:
            return cast("list[bytes]", self.r.lrange(self.kids_key("", tid), 0, -1))
        ids = self.r.hget(self.staged_key(rid), tid)
        if not ids:
            return []
        msgs = cast("list[bytes | None]", self.r.hmget(self.ledger_key(rid), ids.split()))
        return [m for m in msgs if m is not None]

    def staged_kids(self, rid: str, tid: str) -> list[dict[str, Any]]:
        return [orjson.loads(m) for m in self.staged(rid, tid)]

    def clear_kids(self, rid: str, tid: str) -> None:
        """Forget what `tid` staged (sent)."""
        drop_staged(self.r, [self.staged_at(rid, tid)])

    def pending_key(self, rid: str) -> str:
        return self.ks.run(rid, "pending")

    def parked_key(self, rid: str) -> str:
        return self.ks.run(rid, "parked")

    def ledger_key(self, rid: str) -> str:
        return self.ks.run(rid, "ledger")

    def uniq_key(self, rid: str, step: str) -> str:
        return self.ks.uniq_prefix(rid) + step

    def deliveries_key(self, rid: str, tid: str, attempt: object) -> str:
        """Deliveries of one attempt of a task (`begin`), dropped when it commits or retries;
        in its run's slot."""
        return self.ks.deliveries(rid, tid, attempt)

    @property
    def active_key(self) -> str:
        return self.ks.active_runs

    def _active(self, rid: str) -> str:
        """The active-runs set as a script's key; on a cluster the run's counters stand in
        (the scripts leave the set alone when it is their counters: see `self.cluster`)."""
        return self.counters_key(rid) if self.cluster else self.active_key

    @property
    def storing_key(self) -> str:
        return self.ks.storing_runs

    def _storing(self, rid: str) -> str:
        """The storing-runs set as the commit script's key; on a cluster the run's counters
        stand in (the caller adds the run: `run_commits`), as for `_active`."""
        return self.counters_key(rid) if self.cluster else self.storing_key

    @property
    def recent_key(self) -> str:
        return self.ks.recent_runs

    @property
    def outbox_key(self) -> str:
        return self.ks.outbox
