"""Compaction: once a run is complete and its items are stored, its per-task bookkeeping goes
(ledger/state.py); its hash and counters stay for the retention."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ledger.runs import Runs


class Compaction(Runs):
    """Dropping a finished run's per-task bookkeeping."""

    def compact(self, rid: str) -> bool:
        """Drop a finished run's per-task bookkeeping once it is complete and its items are
        stored (or refused by a sink); its hash and counters stay for the retention. False:
        not finished, items not settled, already compacted or no such run."""
        raw = self.chain_def(rid)
        steps: list[str] = []
        if raw:
            try:
                steps = list(_step_ids(orjson.loads(raw).get("root") or {}))
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                steps = []
        keys = [
            self.run_key(rid),
            self.counters_key(rid),
            self.ks.run(rid, "done"),
            self.parked_key(rid),
            self.pending_key(rid),
            self.staged_key(rid),
            *(self.uniq_key(rid, s) for s in steps),
        ]
        if self.cluster:  # the run's own outbox stream: every entry of it is stored
            keys.append(self.ks.run_outbox(rid))
        return bool(self._compact(keys=keys, args=[f"{time.time():.3f}", self.ttl]))

    def compact_settled(self, rids: Sequence[str]) -> list[str]:
        """`compact` those of `rids` that look settled (one pipelined read first, so a drainer
        may call this after every batch); the ones compacted now."""
        rids = [r for r in dict.fromkeys(rids) if r]
        if not rids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for rid in rids:
            pipe.hmget(self.run_key(rid), "status", "compacted")
            pipe.hmget(self.counters_key(rid), "outstanding", "items", "stored", "store_failed")
        res = pipe.execute()
        out = []
        for n, rid in enumerate(rids):
            (status, done), c = res[2 * n], [int(v or 0) for v in res[2 * n + 1]]
            if (
                status in (b"done", b"cancelled")
                and not done
                and c[0] <= 0
                and c[2] + c[3] >= c[1]
                and self.compact(rid)
            ):
                out.append(rid)
        return out


def _step_ids(d: Mapping[str, Any]) -> Any:
    """Step ids of a stored chain definition (`Chain.to_dict()["root"]`), depth first."""
    yield d.get("id", "")
    for c in d.get("then") or ():
        yield from _step_ids(c)
