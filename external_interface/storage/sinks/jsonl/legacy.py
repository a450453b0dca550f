"""Files of the JSONL sink's earlier layout, taken over once by the current one.

The earlier sink wrote `<type>/<seq>-<UTC created>.jsonl` files whose lines wrapped each item in
its metadata (`{"entry", "run", "step", "task", "at", "key", "item"}`) and listed the entries of
each write on a commit line after them (`{"commit": [...]}`); lines after the last commit line
were a torn write. A type folder found with such files and no journal is converted by
`store.TypeStore.adopt`: the committed items become the first part's lines, in order, with
their entry, run and step in the journal; the old files are removed once the journal holds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from external_interface.storage.sinks.base import entry_version

LEGACY_NAME = re.compile(r"([0-9]+)-[0-9]{8}T[0-9]{6}Z\.jsonl")


def legacy_files(folder: Path) -> list[Path]:
    """The earlier layout's files in a type folder, in the order they were written."""
    found = [
        (int(m.group(1)), p) for p in folder.glob("*.jsonl") if (m := LEGACY_NAME.fullmatch(p.name))
    ]
    return [p for _, p in sorted(found)]


def legacy_records(files: list[Path]) -> Iterator[dict[str, Any]]:
    """Every committed record of the files (torn tails skipped)."""
    for path in files:
        block: list[dict[str, Any]] = []
        for line in path.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                break
            if "commit" in rec:
                yield from block
                block = []
            elif isinstance(rec, dict) and "item" in rec:
                block.append(rec)


class KeyGuess:
    """The key fields, from records that hold their values only (`"key": [42]`): for each
    position, the item fields that held that value in every record (the first, if several)."""

    def __init__(self) -> None:
        self.candidates: list[list[str]] | None = None

    def add(self, rec: dict[str, Any]) -> None:
        key, item = rec.get("key"), rec["item"]
        if not isinstance(key, list) or not isinstance(item, dict):
            return
        fits = [[f for f, v in item.items() if v == k] for k in key]
        if self.candidates is None:
            self.candidates = fits
        elif len(fits) == len(self.candidates):
            self.candidates = [
                [f for f in old if f in new] for old, new in zip(self.candidates, fits, strict=True)
            ]

    def fields(self) -> list[str]:
        if not self.candidates or not all(self.candidates):
            return []
        return [c[0] for c in self.candidates]


def legacy_lines(files: list[Path]) -> tuple[list[bytes], list[list[Any]], list[str]]:
    """The committed items of the files as the current layout's lines, the journal groups
    describing them and the key fields (guessed: the old files hold key values, not names)."""
    lines: list[bytes] = []
    groups: list[list[Any]] = []
    key = KeyGuess()
    for rec in legacy_records(files):
        key.add(rec)
        lines.append(orjson.dumps(rec["item"], option=orjson.OPT_NON_STR_KEYS) + b"\n")
        head = [
            version_of(rec),
            rec.get("entry") or "",
            rec.get("run") or "",
            rec.get("step") or "",
        ]
        if groups and groups[-1][:4] == head:
            groups[-1][4] += 1
        else:
            groups.append([*head, 1])
    return lines, groups, key.fields()


def version_of(rec: dict[str, Any]) -> int:
    """The record's version as the current layout counts it (entry order, else write time)."""
    entry = rec.get("entry")
    return entry_version(entry) if entry else int(float(rec.get("at") or 0) * 1e9)
