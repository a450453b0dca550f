"""A misspelled CHAINCRAWL_* variable is named on stderr by the commands whose work the
settings change (start, trigger, parse, shell, demo), not only by `config` and in a worker's
log: a typo'd `CHAINCRAWL_REQUEST_TIMEOT=3` would otherwise run with the default unremarked.
So is a `start --queues` queue nothing sends to (a worker waiting for ever)."""

from __future__ import annotations

import pytest

from cli.__main__ import main, unknown_queues


def test_trigger_names_a_misspelled_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHAINCRAWL_REQUEST_TIMEOT", "3")
    assert main(["trigger", "demo_social", "{page: 1}"]) == 2  # bad seeds: no Redis needed
    err = capsys.readouterr().err.splitlines()
    assert (
        "warning: CHAINCRAWL_REQUEST_TIMEOT is not a chaincrawl setting; did you mean "
        "CHAINCRAWL_REQUEST_TIMEOUT? (ignored; ./control.sh config)"
    ) in err
    assert err[-1].startswith("error: seeds are not valid JSON")


def test_a_read_only_command_says_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHAINCRAWL_REQUEST_TIMEOT", "3")
    assert main(["chains"]) == 0
    assert "REQUEST_TIMEOT" not in capsys.readouterr().err


def test_correct_settings_say_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHAINCRAWL_REQUEST_TIMEOUT", "3")
    main(["trigger", "demo_social", "{page: 1}"])
    assert "warning: CHAINCRAWL" not in capsys.readouterr().err


def test_start_names_a_queue_nothing_sends_to() -> None:
    assert unknown_queues("demo,resources,default") == []
    assert unknown_queues("") == []
    assert unknown_queues("demo, dmeo") == [
        "queue 'dmeo' is no site's or chain step's queue; did you mean 'demo'?"
    ]
    [far] = unknown_queues("zzzzzz")
    assert (
        far.startswith("queue 'zzzzzz' is no site's or chain step's queue (queues: ")
        and "demo" in far
    )
