"""The Python side of `control.sh`: one module per command group."""

from __future__ import annotations


class UserError(Exception):
    """A mistake on the command line: printed as one line, no traceback, exit status 2."""
