"""Another revision's code for the benchmark's workers: `chaincrawl@REV` crawls with the workers
of commit REV while the rest of the run (trigger, sites, peers) is this checkout's, so a change's
before and after are measured in one interleaved run:

    .venv/bin/python -m bench.compare --scenarios cpu --repeat 3 --systems chaincrawl@f249845,chaincrawl

The revision is exported once (`git archive`, no work tree or branch of the repository touched)
to `var/bench/rev/<sha>/` and reused; its workers run with this checkout's virtual environment,
so a revision whose lock file differs is measured on today's dependencies. The trigger writes the
run with today's code: a revision whose wire formats (task envelope, run records) differ from
today's cannot be measured this way, and its crawl fails the run's exact-count check.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from bench.chaincrawl_bench import ROOT

REVS = ROOT / "var" / "bench" / "rev"


def resolve(rev: str) -> str:
    """The full commit id of `rev` (a ValueError naming it when git does not know it)."""
    out = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise ValueError(f"chaincrawl@{rev}: no such commit in {ROOT}")
    return out.stdout.strip()


def checkout(rev: str) -> Path:
    """The exported tree of `rev` (made on first use), ready to run workers from."""
    sha = resolve(rev)
    path = REVS / sha[:12]
    done = path / ".exported"
    if done.exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", sha], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(path, filter="data")
    (path / ".venv").unlink(missing_ok=True)
    (path / ".venv").symlink_to(ROOT / ".venv")
    done.write_text(sha + "\n")
    return path
