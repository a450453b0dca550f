"""Where chaincrawl's state lives in Redis: every key of a run, of a task without a run, of a
site, in one place, with the hash tags that keep what one Lua script touches in one cluster
slot.

Redis Cluster hashes only the part of a key between the first `{` and the next `}` (its hash
tag) when there is one, and runs a script only when all its keys share a slot. So:

- a run's keys share `{<run id>}`: `cc:run:{r1}`, `cc:run:{r1}:counters`, `...:done`,
  `...:ledger`, `...:pending`, `...:parked`, `...:uniq:<step>`, `...:wake`, and the staging list and
  delivery counter of each of its tasks (`...:kids:<tid>`, `...:deliv:<tid>:<attempt>`):
  the commit, cancel, pause, resume and park scripts each stay on one slot;
- tasks without a run share `{norun}` (`cc:done:{norun}:<tid>`, `cc:kids:{norun}:<tid>`,
  their outbox on a cluster): a batch of them commits in one script; a delivery counter
  without a run keeps its own tag (`cc:deliv:{<tid>}:<attempt>`), spread over the slots;
- a site's keys share `{<site>}` (`site()`), so its pools and limits can be one script's: a
  pool of cookies or devices (`pool()`), the site's proxy channel (`proxy_channel()`), the
  leases and rate keys of every limit scope of the site (`limit()`: `demo`, `demo.h5.feed`,
  `demo.render` all on `{demo}`) and its adaptive throttle (`throttle()`); a pool (and the
  proxy channel) is split into sub-pools (`pool_parts()`, `part_tags()`): the first on
  `{<site>}`, the others on `{<site>~<j>}`, slots chosen to fall on other masters, so one
  site's leases spread over the cluster while each sub-pool's script stays on one slot;
- the global proxy pool shared by every site shares `{proxy}` (`proxy()`): one slot by design;
- the alert evaluator's state, notices and history share `{alerts}` (`alerts()`): its
  transition script touches three of them;
- a change-watched set of keys shares `{<name>}` under `recrawl:` (`recrawl()`): its history, due
  times and counters, which its observe and dispatch scripts touch together;
- the fleet budget's holders, waiters and allocations share `{fleet}` (`fleet()`): the share
  script water-fills across every site at once;
- everything else (`runs:active`, `runs:storing`, `runs:recent`, the outbox, metrics, the set
  of throttled sites) is global, untagged.

The tags are written on a single Redis too: the braces are just characters there, so one
naming serves both, and nothing depends on which one is running. What each key holds:
docs/architecture.md (the run ledger) and docs/monitoring.md (metrics, health, alerts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

NORUN = "{norun}"  # the hash tag of the keys of tasks without a run
PROXY = "{proxy}"  # the hash tag of the global proxy pool's keys
ALERTS = "{alerts}"  # the hash tag of the alert evaluator's keys
FLEET = "{fleet}"  # the hash tag of the fleet budget's keys


def tag(value: object) -> str:
    """A hash tag: `{value}` (a value holding `}` would end the tag early: refused)."""
    text = str(value)
    if "}" in text or "{" in text:
        raise ValueError(f"a hash-tagged key part may not hold braces: {text!r}")
    return "{" + text + "}"


@functools.lru_cache(maxsize=1024)
def part_tags(site: str, parts: int) -> tuple[str, ...]:
    """The hash-tag values of a site's `parts` sub-pools: the site itself first (the layout
    before sub-pools, so members added then stay where they are), then `<site>~<j>`, each j
    the smallest whose slot falls in the next `1/parts` of the slot space after the site's.
    A cluster created with its slots dealt evenly over `parts` masters (or a divisor of
    `parts`) thus holds every sub-pool of a site on another master; on one Redis they are
    just names. The same on every machine: nothing depends on the cluster's slot map."""
    if parts < 1:
        raise ValueError("a pool has at least one part")
    tag(site)  # braces refused
    width = REDIS_CLUSTER_HASH_SLOTS / parts
    first = int(key_slot(site.encode()) // width)
    out, j = [site], 0
    for i in range(1, parts):
        want = (first + i) % parts
        while True:
            j += 1
            name = f"{site}~{j}"
            if int(key_slot(name.encode()) // width) == want:
                out.append(name)
                break
    return tuple(out)


@dataclass(frozen=True)
class Keyspace:
    """The keys under one prefix (`CHAINCRAWL_KEY_PREFIX`)."""

    prefix: str

    def key(self, *parts: object) -> str:
        """A global (untagged) key: `key("runs", "active")` -> `cc:runs:active`."""
        return ":".join((self.prefix, *(str(p) for p in parts)))

    # --- a run and its tasks -----------------------------------------------------------------

    def run(self, rid: str, *parts: object) -> str:
        """`cc:run:{rid}` and, with parts, `cc:run:{rid}:<parts>` (all on the run's slot)."""
        return self.key("run", tag(rid), *parts)

    def counters(self, rid: str) -> str:
        return self.run(rid, "counters")

    def wake(self, rid: str) -> str:
        """The list `RunHandle.wait()` blocks on; the scripts write it as `<run hash>:wake`
        (utils/wake.lua), so the two namings must agree."""
        return self.run(rid, "wake")

    def done(self, rid: str, tid: str) -> str:
        """The run's set of committed task ids; without a run, the task's own flag."""
        return self.run(rid, "done") if rid else self.key("done", NORUN, tid)

    def kids(self, rid: str, tid: str) -> str:
        """A staging list of child messages: a task's without a run, or a client's (`tid` a
        staging name: the trigger's, a resume's)."""
        return self.run(rid, "kids", tid) if rid else self.key("kids", NORUN, tid)

    def staged(self, rid: str) -> str:
        """A run's hash of children its committed tasks still have to send: tid -> their ids
        (the messages are in the run's ledger)."""
        return self.run(rid, "staged")

    def deliveries(self, rid: str, tid: str, attempt: object) -> str:
        """How many times an attempt of a task was delivered (the poison-message cap)."""
        if rid:
            return self.run(rid, "deliv", tid, attempt)
        return self.key("deliv", tag(tid), attempt)

    def uniq_prefix(self, rid: str) -> str:
        """`cc:run:{rid}:uniq:`, the step name follows (the commit script appends it)."""
        return self.run(rid, "uniq", "")

    # --- global ------------------------------------------------------------------------------

    @property
    def active_runs(self) -> str:
        return self.key("runs", "active")

    @property
    def storing_runs(self) -> str:
        return self.key("runs", "storing")

    @property
    def recent_runs(self) -> str:
        return self.key("runs", "recent")

    @property
    def outbox(self) -> str:
        return self.key("outbox")

    @property
    def outbox_dead(self) -> str:
        """The outbox's dead letters (entries a sink refused for good, or malformed)."""
        return self.key("outbox", "dead")

    @property
    def outbox_errors(self) -> str:
        """The outbox's last error per entry id (the drainer's retries)."""
        return self.key("outbox", "errors")

    def run_outbox(self, rid: str) -> str:
        """On a cluster the commit script cannot reach the global outbox from the run's
        slot: a run's items go to this stream of its own there."""
        return self.run(rid, "outbox") if rid else self.key("outbox", NORUN)

    @property
    def outbox_dead_runs(self) -> str:
        """On a cluster: the runs whose own streams hold dead letters (written by the drainer
        beside its acknowledgement, so status readers need not SCAN every master)."""
        return self.key("outbox", "deadruns")

    def run_outbox_dead(self, rid: str) -> str:
        """The dead letters of a run's own stream, in the run's slot (the global dead-letter
        stream is on another): `cc:run:{rid}:outbox:dead`, `cc:outbox:{norun}:dead`."""
        return self.run(rid, "outbox", "dead") if rid else self.key("outbox", NORUN, "dead")

    # --- a site ------------------------------------------------------------------------------

    def site(self, site: str, *parts: object) -> str:
        """`cc:site:{site}:<parts>`: a site's keys on one slot."""
        return self.key("site", tag(site), *parts)

    def pool(self, kind: str, site: str) -> str:
        """The base of a site's pool of one kind (cookie, device_id), `cc:site:{site}:pool:<kind>`:
        the lease engine's keys and the production flag hang under it, on the site's slot."""
        return self.site(site, "pool", kind)

    def proxy_channel(self, site: str) -> str:
        """The base of a site's proxy channel, `cc:site:{site}:proxy`, on the site's slot."""
        return self.site(site, "proxy")

    def pool_parts(self, kind: str, site: str, parts: int) -> list[str]:
        """The bases of a pool's sub-pools (`part_tags`): `cc:site:{demo}:pool:cookie`,
        `cc:site:{demo~2}:pool:cookie`, ...: each sub-pool's keys share one slot."""
        return [self.pool(kind, t) for t in part_tags(site, parts)]

    def proxy_channel_parts(self, site: str, parts: int) -> list[str]:
        """The bases of a site's proxy channel's sub-pools (`part_tags`)."""
        return [self.proxy_channel(t) for t in part_tags(site, parts)]

    @property
    def pools(self) -> str:
        """The set of every pool ("kind:site"), for health reports: global, written beside the
        scripts (a plain SADD), never from inside one."""
        return self.key("pools")

    def limit(self, scope: str, kind: str) -> str:
        """A limit scope's `leases` zset or `tat` rate key, on the slot of its site (the
        scope's first dotted part): `cc:site:{demo}:gate:demo.h5.feed:tat`. Every scope a task
        passes starts with its site, so the gate's scripts stay on one slot."""
        return self.site(scope.split(".", 1)[0], "gate", scope, kind)

    def throttle(self, site: str) -> str:
        """The site's adaptive-throttle hash (`cc:site:{site}:throttle`)."""
        return self.site(site, "throttle")

    def adaptive(self, site: str, endpoint: str, pattern: str, *parts: object) -> str:
        """An adaptive endpoint's decision for one URL pattern (hash) and, with parts, its
        evidence (`...:evidence`): `cc:site:{demo}:adaptive:demo.mix.feed:/mix/feed?page`."""
        return self.site(site, "adaptive", endpoint, pattern, *parts)

    @property
    def adaptive_index(self) -> str:
        """The set of every adaptive (endpoint, pattern), `endpoint pattern` (global: status
        reads it)."""
        return self.key("adaptive")

    @property
    def throttled_sites(self) -> str:
        """The set of sites with a throttle hash (global: the readers' index of them)."""
        return self.key("throttled")

    # --- the global proxy pool -----------------------------------------------------------------

    def proxy(self, *parts: object) -> str:
        """`cc:{proxy}:<parts>`: the global proxy pool's keys, one slot shared by every site."""
        return self.key(PROXY, *parts)

    # --- alerts ------------------------------------------------------------------------------

    def alerts(self, part: str) -> str:
        """`cc:{alerts}:<part>` (samples, state, notify, history, lock): one slot."""
        return self.key(ALERTS, part)

    # --- change-driven re-crawls and the fleet budget ------------------------------------------

    def recrawl(self, watch: str, *parts: object) -> str:
        """`cc:recrawl:{<watch>}:<parts>`: one watched set's keys, on one slot."""
        return self.key("recrawl", tag(watch), *parts)

    @property
    def recrawl_watches(self) -> str:
        """The hash of every watched set's settings (global: the observers' index of them)."""
        return self.key("recrawl", "watches")

    def fleet(self, *parts: object) -> str:
        """`cc:{fleet}:<parts>`: the fleet budget's keys, one slot shared by every site."""
        return self.key(FLEET, *parts)

    # --- what a key is for (benchmarks, the keyspace report) -----------------------------------

    def family(self, key: str) -> str:
        """The family of a key by its name, for a breakdown of a crawl's commands: `pool:cookie`
        (a site's lease pool), `proxy channel`, `proxy pool` (the global one), `gate`,
        `throttle`, `run` (a run's ledger and counters), `dedup` (a run's unique steps and the
        item dedup), `outbox`, `metrics`, ...; a key under another prefix is `foreign`."""
        head, sep, rest = key.partition(":")
        if head != self.prefix or not sep:
            return "foreign"
        first, _, tail = rest.partition(":")
        if first == "site":  # cc:site:{demo}:<what>[:<kind>...]
            parts = tail.partition(":")[2].split(":")
            if parts[0] == "pool" and len(parts) > 1:
                return f"pool:{parts[1]}"
            return {"proxy": "proxy channel"}.get(parts[0], parts[0] or "site")
        if first == "run":  # cc:run:{rid}[:<what>]
            what = tail.partition(":")[2].partition(":")[0]
            if what == "outbox":
                return "outbox"
            return "dedup" if what == "uniq" else "run"
        if first == "outbox":
            return "outbox"
        if first in ("done", "kids", "deliv"):  # tasks without a run
            return "run"
        if first == PROXY:
            return "proxy pool"
        if first in ("dedup", "dedupstats"):
            return "dedup"
        return first
