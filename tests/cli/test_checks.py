"""cli/checks.py: the setting values `start` and `config` find unusable before a worker runs."""

from __future__ import annotations

import argparse

import pytest

from cli import __main__ as cli_main
from cli import checks, procs
from config import reset_settings


class Stop(Exception):
    pass


def test_start_warns_of_an_unknown_sink_before_it_starts_a_worker(monkeypatch, capsys) -> None:
    """A worker whose drainer cannot build its sinks stores nothing while `start` said it was
    ready: the sink is named, with its nearest, before Redis or a worker is started."""
    monkeypatch.setenv("CHAINCRAWL_SINKS", "jsnol")
    reset_settings()
    try:
        assert checks.sink_problems() == [
            "CHAINCRAWL_SINKS: unknown sink 'jsnol'; did you mean 'jsonl'?"
        ]

        def stop(*a: object) -> None:
            raise Stop

        monkeypatch.setattr(procs, "ensure_redis", stop)
        with pytest.raises(Stop):
            cli_main.cmd_start(argparse.Namespace(queues=None))
        err = capsys.readouterr().err
        assert "warning: CHAINCRAWL_SINKS: unknown sink 'jsnol'; did you mean 'jsonl'?" in err
        monkeypatch.setenv("CHAINCRAWL_SINKS", "jsonl")
        reset_settings()
        assert checks.sink_problems() == []
    finally:
        monkeypatch.undo()
        reset_settings()
