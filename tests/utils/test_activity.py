"""The process's activity notes: a run's tasks done ends a drainer's gathering window."""

from __future__ import annotations

import threading

from utils import process


def _gather_in_thread(timeout: float) -> threading.Thread:
    t = threading.Thread(target=process.gather, args=(timeout,), daemon=True)
    t.start()
    return t


def test_a_note_of_tasks_done_ends_a_gather_under_way() -> None:
    process.gather(0.0)  # no note left from before
    t = _gather_in_thread(600.0)
    process.note_tasks_done()
    t.join(30)
    assert not t.is_alive()


def test_a_note_made_before_the_gather_ends_the_next_one_and_only_that_one() -> None:
    """A run done between a drainer's read and its next window is not missed; the note is
    used up by that window, so the one after waits as usual."""
    process.gather(0.0)
    process.note_tasks_done()
    t = _gather_in_thread(600.0)
    t.join(30)
    assert not t.is_alive()
    assert not process._tasks_done.is_set()


def test_a_stop_set_before_the_gather_returns_at_once() -> None:
    stop = threading.Event()
    stop.set()
    process.gather(600.0, stop)
