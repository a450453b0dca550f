"""The Python side of `control.sh`: one module per command group."""

from __future__ import annotations

# exit status: Redis (or the broker) did not answer, or the embedded Redis is stopped
REDIS_UNREACHABLE = 5
# exit status of `trigger`: its run is paused because a Redis Cluster lost its slot range
RUN_ON_LOST_SLOTS = 6


class UserError(Exception):
    """A mistake on the command line: printed as one line, no traceback, exit status 2."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class StartFailed(UserError):
    """A process `control.sh` started did not come up: one message (with its log's last
    lines), no traceback, exit status 1."""

    exit_code = 1
