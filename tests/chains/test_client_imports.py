"""What a triggering script's `import chains` imports: the client starts runs and watches them,
so the worker's fetch stack, the sinks and their libraries stay out of it (each is loaded by
path when a worker first needs it)."""

from __future__ import annotations

import json
import subprocess
import sys

from config import ROOT

# the modules the client path imported before they became plugins loaded on first use
HEAVY = (
    "gevent",
    "pycurl",
    "parsel",
    "lxml",
    "playwright",
    "psycopg",
    "pymongo",
    "confluent_kafka",
    "external_interface.fetch",
    "external_interface.browser",
    "external_interface.storage.sinks.jsonl",
    "external_interface.storage.sinks.mongo",
    "external_interface.storage.sinks.postgres",
    "external_interface.storage.sinks.http",
    "external_interface.storage.sinks.kafka",
)


def imported_after(code: str) -> set[str]:
    """The modules of HEAVY in sys.modules after `code`, run in a fresh interpreter."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_chains_leaves_out_the_worker_stack_and_the_sinks() -> None:
    assert imported_after("import chains") == set()


def test_loading_a_sink_imports_its_module_only() -> None:
    code = "from external_interface.storage.routing import sink_registry\nsink_registry.get('jsonl').load()"
    assert imported_after(code) == {"external_interface.storage.sinks.jsonl"}
