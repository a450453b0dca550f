"""What `control.sh cancel` says: with tasks left in the broker and no worker up, why the run
stays `cancelling` (it did, with no word of why, until a worker started and skipped them)."""

from __future__ import annotations

from cli.__main__ import cancel_line


def test_with_no_worker_up_it_says_why_the_run_stays_cancelling() -> None:
    line = cancel_line("r1", "running", 0, 1, workers_up=False)
    assert line.startswith("run r1 cancelled: 0 waiting task(s) dropped; 1 in the broker")
    assert line.endswith(
        "no worker is up, so they wait in the broker and the run shows cancelling until one "
        "starts and skips them (./control.sh start)"
    )
    assert "no worker" not in cancel_line("r1", "running", 3, 2, workers_up=True)
    assert cancel_line("r1", "done", 0, 0, workers_up=False) == (
        "run r1 had already ended (done): nothing to cancel"
    )
