"""utils.process: ids unique within a process, across threads and in a forked child."""

from __future__ import annotations

import os
import threading

from utils.process import new_id


def test_ids_look_like_uuid4_hex_and_never_repeat_across_threads() -> None:
    got: list[list[str]] = [[] for _ in range(8)]

    def make(out: list[str]) -> None:
        out.extend(new_id() for _ in range(5000))

    threads = [threading.Thread(target=make, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for g in got for i in g]
    assert len(set(ids)) == len(ids) == 40000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids[:100])


def test_a_forked_child_draws_a_new_prefix() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, new_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode()
    os.close(r)
    os.close(w)
    assert child[:20] != new_id()[:20]
