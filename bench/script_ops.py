"""What `bench.redis_cost`'s `MONITOR` crawl reads of script calls: each call by "family op"
(a lease script's operation, a release's action after it; a checkout that lent also as
"... lent"), and the commands each ran, so the leases' share reads by what they do (an empty
checkout against one that lent, a refill's add).

MONITOR (Redis 6.2) shows a script's call, then the commands it ran, marked `lua`; the server
runs one script at a time, so every `lua` command belongs to the call read last.
"""

from __future__ import annotations

from collections import Counter


def script_op(parts: list[str], fam: str) -> str:
    """A script call (`parts`: EVALSHA, its sha, numkeys, keys, args) as "family op": its
    first argument when a word, a release's action after it; else the family alone."""
    try:
        argv = parts[3 + int(parts[2]) :]
    except (IndexError, ValueError):
        return fam
    op = argv[0] if argv and argv[0].isalpha() and len(argv[0]) <= 12 else ""
    if op == "release" and len(argv) > 3:
        op = f"release {argv[3]}"
    return f"{fam} {op}".strip()


class ScriptOps:
    """Script calls and their commands by operation, fed every command MONITOR reads."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.commands: Counter[str] = Counter()
        self._current = ""  # the call whose commands MONITOR shows next

    def count(self, parts: list[str], fam: str, in_script: bool) -> None:
        name = parts[0].lower()
        if in_script:
            self.commands[self._current] += 1
            if name == "hset" and parts[1].endswith(":token") and "checkout" in self._current:
                self.calls[f"{self._current} lent"] += 1
            return
        self._current = script_op(parts, fam) if name in ("evalsha", "eval") else ""
        if self._current:
            self.calls[self._current] += 1

    def merge(self, other: ScriptOps) -> None:
        self.calls.update(other.calls)
        self.commands.update(other.commands)

    def per_page(self, pages: int) -> dict[str, dict[str, float]]:
        return {
            "scripts_by_op_per_page": {k: round(v / pages, 3) for k, v in self.calls.most_common()},
            "script_commands_by_op_per_page": {
                k: round(v / pages, 3) for k, v in self.commands.most_common()
            },
        }
