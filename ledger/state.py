"""Run records and exact completion counters in Redis: `RunState`, one object for everything
a run's tasks, the sweeper and the views do to a run (the scripts themselves live in the
modules it combines).

Every key, what it holds and why (exactly once, compaction, cancel, pause, backpressure):
docs/architecture.md, "The run ledger"; the names and hash tags: utils/keyspace.py.
"""

from __future__ import annotations

from ledger.commits import Commits
from ledger.compaction import Compaction
from ledger.control import Control
from ledger.records import (
    COUNTERS,
    DELIV_TTL,
    RECENT_KEEP,
    RUN_TTL,
    Begun,
    Cancelled,
    CommitCall,
    Committed,
    Kid,
    Paused,
    Resumed,
    StagedAt,
    drop_staged,
    items_settled,
    run_status,
    stalled_resends,
    step_counters,
)


class RunState(Commits, Control, Compaction):
    """All run bookkeeping against one Redis; cheap to build, thread-safe. The facade of the
    ledger's concerns: keys (ledger/keys.py), runs (runs.py), commits (commits.py), cancel and
    pause (control.py), compaction (compaction.py)."""


__all__ = [
    "COUNTERS",
    "DELIV_TTL",
    "RECENT_KEEP",
    "RUN_TTL",
    "Begun",
    "Cancelled",
    "CommitCall",
    "Committed",
    "Kid",
    "Paused",
    "Resumed",
    "RunState",
    "StagedAt",
    "drop_staged",
    "items_settled",
    "run_status",
    "stalled_resends",
    "step_counters",
]
