"""The Python side of `control.sh`: one module per command group."""

from __future__ import annotations


class UserError(Exception):
    """A mistake on the command line: printed as one line, no traceback, exit status 2."""

    exit_code = 2


class StartFailed(UserError):
    """A process `control.sh` started did not come up: one message (with its log's last
    lines), no traceback, exit status 1."""

    exit_code = 1
