"""lifecycle/batch.py: a batch's entries side by side under gevent, the batch woken once when
the last of them ends (not once an entry), their hand-outs and errors as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
from gevent import monkey
monkey.patch_all()
import contextlib, gevent, greenlet
from lifecycle import batch

class Rt:
    def __init__(self):
        import threading
        self.local = threading.local()

    def page_rank(self, meta):
        return 0

class Slots:
    @contextlib.contextmanager
    def slot(self, rank):
        yield

ran, woken = [], [0]
def one(spec, e, b):
    gevent.sleep(e["sleep"])
    if e.get("boom"):
        raise ValueError(e["id"])
    ran.append(e["id"])

def hand_out(k):
    return "over its budget" if k >= HAND_FROM else ""

def call(entries):
    me = greenlet.getcurrent()
    def trace(ev, args):
        if ev == "switch" and args[1] is me:
            woken[0] += 1
    greenlet.settrace(trace)
    try:
        return batch._side_by_side(Rt(), Slots(), None, entries, hand_out, one)
    finally:
        greenlet.settrace(None)

HAND_FROM = 99
entries = [((None, {"id": f"t{i}", "sleep": s, "meta": {}}), None)
           for i, s in enumerate([0.03, 0.0, 0.02, 0.01, 0.0])]
assert call(entries) == ([], "")
assert sorted(ran) == ["t0", "t1", "t2", "t3", "t4"], ran
assert woken[0] == 1, woken  # once, by the last entry to end

HAND_FROM, ran[:], woken[0] = 3, [], 0
left, why = call(entries)
assert [e["id"] for e in left] == ["t3", "t4"] and why == "over its budget"
assert sorted(ran) == ["t0", "t1", "t2"] and woken[0] == 1

HAND_FROM = 99
entries[1][0][1]["boom"] = True
try:
    call(entries)
except ValueError as exc:
    assert str(exc) == "t1"
else:
    raise AssertionError("an entry's error is raised once every entry ended")
assert "t0" in ran  # the slowest entry still ran to its end
assert call([]) == ([], "")
print("ok")
"""


def test_side_by_side_entries_wake_the_batch_once() -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
