"""broker/ready_check.py: redis-py's zero-timeout check of a pooled connection, answered by the
operating system's poll under gevent (no hub round trip), anything else by redis-py's own."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from broker import ready_check

ROOT = Path(__file__).resolve().parents[2]


def recording(calls: list[Any], answer: bool) -> Any:
    """A stand-in for redis-py's check: records the timeouts it is asked with."""

    def check(sock: Any, timeout: float | None) -> bool:
        calls.append(timeout)
        return answer

    return check


def test_a_zero_timeout_polls_the_socket_itself() -> None:
    calls: list[Any] = []
    check = ready_check.ready_now(recording(calls, True), select.poll)
    a, b = socket.socketpair()
    try:
        assert check(a, 0) is False  # nothing to read
        b.sendall(b"+OK\r\n")
        assert check(a, 0) is True  # a reply left over
        a.recv(16)
        assert check(a, 0) is False
        b.close()
        assert check(a, 0) is True  # the server closed it: readable (EOF), as redis-py says
        assert calls == []  # never redis-py's (gevent's) poll
    finally:
        a.close()


def test_a_wait_goes_to_redis_pys_check() -> None:
    calls: list[Any] = []
    check = ready_check.ready_now(recording(calls, False), select.poll)
    a, b = socket.socketpair()
    try:
        assert check(a, 0.5) is False
        assert check(a, None) is False
        assert calls == [0.5, None]
    finally:
        a.close()
        b.close()


def test_tls_bytes_already_decrypted_count_as_readable() -> None:
    class Tls:
        def pending(self) -> int:
            return 3

        def fileno(self) -> int:  # never polled: the pending bytes answer first
            raise AssertionError("polled")

    check = ready_check.ready_now(lambda s, t: False, select.poll)
    assert check(Tls(), 0) is True


def test_without_gevent_nothing_is_patched() -> None:
    from redis._parsers import hiredis

    before = hiredis._socket_can_read
    assert ready_check.apply() is False
    assert hiredis._socket_can_read is before


def test_under_gevent_a_pooled_connection_is_checked_without_a_switch() -> None:
    """In a monkey-patched process (a gevent worker): installed, a command's checkout does
    not switch into the hub, and the answers are redis-py's."""
    code = textwrap.dedent(
        """
        from gevent import monkey
        monkey.patch_all()
        import socket, greenlet
        from gevent.hub import Hub
        from redis._parsers import hiredis
        from broker import ready_check
        before = hiredis._socket_can_read
        assert ready_check.apply() is True and ready_check.apply() is True
        assert hiredis._socket_can_read is not before
        a, b = socket.socketpair()
        switches = []
        greenlet.settrace(
            lambda ev, args: switches.append(ev) if isinstance(args[1], Hub) else None
        )
        assert hiredis._socket_can_read(a, 0) is False
        b.sendall(b"x")
        assert hiredis._socket_can_read(a, 0) is True
        greenlet.settrace(None)
        assert switches == [], switches
        before_switches = []
        greenlet.settrace(
            lambda ev, args: before_switches.append(ev) if isinstance(args[1], Hub) else None
        )
        a.recv(1)
        assert before(a, 0) is False  # redis-py's own under gevent: through the hub
        greenlet.settrace(None)
        assert before_switches, "gevent's poll no longer switches: the patch may be moot"
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
