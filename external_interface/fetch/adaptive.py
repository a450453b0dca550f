"""Adaptive rendering: for each endpoint and URL pattern, is a plain fetch enough, or must
the page be rendered? Learnt from pages fetched both ways, kept in Redis for every worker.

An endpoint declared `render="auto"` parses a `Response` (`css`, `xpath`, `json`) without
saying how it was got. Per (endpoint, URL pattern) this module keeps a decision:

- `learning`: every page is a **sample**: fetched and rendered, the endpoint run on both, the
  outputs (items and follow-ups) compared; the rendered page's are kept. After
  `CHAINCRAWL_BROWSER_ADAPTIVE_SAMPLES` (3) samples that all agree the pattern is `http`; the
  first that disagrees makes it `render`.
- `http`: pages are fetched. Every `CHAINCRAWL_BROWSER_ADAPTIVE_RESAMPLE`th (20th) page is a
  sample again, and so is a page whose fetch yields no item (or no page the parser can read)
  where the samples had items: a page type that became rendered is caught at its first page,
  not twenty pages later. A disagreeing sample makes the pattern `render`.
- `render`: pages are rendered; every Nth is a sample, and as many agreeing samples in a row
  as it took to learn take the pattern back to `http`.

A URL pattern is the path with every segment holding a digit replaced by `*`, and the names of
the query's arguments (`/mix/post/p12` -> `/mix/post/*`, `/mix/feed?page=3` -> `/mix/feed?page`).

Redis (`utils/keyspace.py`, on the site's slot): `site:{site}:adaptive:<endpoint>:<pattern>`,
a hash (`decision`, `pages`, `fetched`, `rendered`, `samples`, `same`, `differ`, `streak`,
`changes`, `decided_at`, `decided_page`, `sample_items`) and its `:evidence` list (the last
`CHAINCRAWL_BROWSER_ADAPTIVE_EVIDENCE` samples as JSON); the global `adaptive` set indexes
them for `status`. Each page costs one script call; a sample one more.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
import redis

from settings.browser import BrowserSettings, get_browser_settings
from utils.keyspace import Keyspace

HTTP, RENDER, SAMPLE, LEARNING = "http", "render", "sample", "learning"

_PLAN = """
local h = KEYS[1]
local pages = redis.call('HINCRBY', h, 'pages', 1)
local decision = redis.call('HGET', h, 'decision') or 'learning'
local plan
if decision == 'learning' then
  plan = 'sample'
else
  local every = tonumber(ARGV[1])
  local since = tonumber(redis.call('HGET', h, 'decided_page') or '0')
  if every > 0 and (pages - since) % every == 0 then
    plan = 'sample'
  elseif decision == 'render' then
    plan = 'render'
  else
    plan = 'http'
  end
end
if plan == 'http' then
  redis.call('HINCRBY', h, 'fetched', 1)
else
  redis.call('HINCRBY', h, 'rendered', 1)
end
return {plan, decision, redis.call('HGET', h, 'sample_items') or '0'}
"""

_RECORD = """
local h = KEYS[1]
local same = ARGV[1] == '1'
local needed = tonumber(ARGV[2])
redis.call('HINCRBY', h, 'samples', 1)
if ARGV[7] == '1' then
  redis.call('HINCRBY', h, 'rendered', 1)
end
local decision = redis.call('HGET', h, 'decision') or 'learning'
local streak = 0
if same then
  redis.call('HINCRBY', h, 'same', 1)
  streak = redis.call('HINCRBY', h, 'streak', 1)
  redis.call('HSET', h, 'sample_items', ARGV[6])
else
  redis.call('HINCRBY', h, 'differ', 1)
  redis.call('HSET', h, 'streak', 0)
end
local new = decision
if not same then
  new = 'render'
elseif streak >= needed then
  new = 'http'
end
if new ~= decision then
  redis.call('HSET', h, 'decision', new, 'decided_at', ARGV[5],
             'decided_page', redis.call('HGET', h, 'pages'))
  if decision ~= 'learning' then
    redis.call('HINCRBY', h, 'changes', 1)
  end
end
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return new
"""


def url_pattern(url: str) -> str:
    """The URL's page type: its path, segments holding a digit as `*`, and the query's
    argument names (sorted) without their values."""
    parts = urlsplit(url)
    path = "/".join("*" if any(c.isdigit() for c in seg) else seg for seg in parts.path.split("/"))
    names = sorted({k for k, _ in parse_qsl(parts.query, keep_blank_values=True)})
    return (path or "/") + ("?" + "&".join(names) if names else "")


def fingerprint(outputs: Iterable[Any]) -> list[str]:
    """What a page yielded, comparable across two runs: each item as its type and JSON, each
    follow-up as its parameters, sorted (the order a page lists things in is no difference)."""
    out = []
    for o in outputs:
        dump = getattr(o, "model_dump", None)
        if dump is not None:
            out.append(
                f"{getattr(o, 'item_type', type(o).__name__)} "
                f"{orjson.dumps(dump(mode='json'), option=orjson.OPT_SORT_KEYS).decode()}"
            )
        else:
            params = getattr(o, "params", o)
            out.append(f"follow {orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()}")
    return sorted(out)


def items_in(prints: Sequence[str]) -> int:
    return sum(1 for p in prints if not p.startswith("follow "))


@dataclass(frozen=True)
class Plan:
    """How to get this page: `mode` http, render or sample; the pattern's `decision` before
    it; `sample_items`, the items the last agreeing sample yielded (0: none seen)."""

    mode: str
    decision: str
    sample_items: int = 0


@dataclass(frozen=True)
class Sample:
    """One page fetched and rendered: how their outputs compared."""

    url: str
    same: bool
    http_items: int
    rendered_items: int
    missing: int = 0  # outputs the rendered page had and the fetched one lacked
    extra: int = 0  # outputs only the fetched page had
    http_error: str = ""  # the error the fetched page's parse raised
    suspect: bool = False  # not planned: the fetched page looked empty where samples had items

    def describe(self) -> str:
        if self.same:
            return f"same: {self.rendered_items} items both ways"
        got = (
            f"fetched: {self.http_error}" if self.http_error else f"fetched {self.http_items} items"
        )
        return (
            f"differ: rendered {self.rendered_items} items, {got} "
            f"({self.missing} outputs missing, {self.extra} extra)"
        )


@dataclass(frozen=True)
class Decision:
    """One (endpoint, pattern) as `status` shows it."""

    endpoint: str
    pattern: str
    decision: str
    pages: int
    fetched: int
    rendered: int
    samples: int
    same: int
    differ: int
    changes: int
    decided_at: float | None
    evidence: tuple[dict[str, Any], ...]

    @property
    def rendered_share(self) -> float:
        return self.rendered / self.pages if self.pages else 0.0


class AdaptiveStore:
    """The decisions of every adaptive endpoint, in Redis (module docstring)."""

    def __init__(
        self, client: redis.Redis, prefix: str, settings: BrowserSettings | None = None
    ) -> None:
        self.r = client
        self.ks = Keyspace(prefix)
        self.settings = settings or get_browser_settings()
        self._plan = client.register_script(_PLAN)
        self._record = client.register_script(_RECORD)
        self._indexed: set[tuple[str, str]] = set()

    def _key(self, endpoint: str, pattern: str, *parts: str) -> str:
        return self.ks.adaptive(endpoint.split(".", 1)[0], endpoint, pattern, *parts)

    def plan(self, endpoint: str, pattern: str) -> Plan:
        """How the next page of this pattern is got (and counted as fetched or rendered)."""
        if (endpoint, pattern) not in self._indexed:
            self.r.sadd(self.ks.adaptive_index, f"{endpoint} {pattern}")
            self._indexed.add((endpoint, pattern))
        mode, decision, items = self._plan(
            keys=[self._key(endpoint, pattern)], args=[self.settings.adaptive_resample]
        )
        return Plan(_text(mode), _text(decision), int(items))

    def record(self, endpoint: str, pattern: str, sample: Sample) -> str:
        """A sample's verdict: the pattern's decision after it."""
        s = self.settings
        evidence = orjson.dumps(
            {
                "at": round(time.time(), 3),
                "url": sample.url,
                "same": sample.same,
                "http_items": sample.http_items,
                "rendered_items": sample.rendered_items,
                "missing": sample.missing,
                "extra": sample.extra,
                "http_error": sample.http_error,
                "suspect": sample.suspect,
                "why": sample.describe(),
            }
        )
        new = self._record(
            keys=[self._key(endpoint, pattern), self._key(endpoint, pattern, "evidence")],
            args=[
                int(sample.same),
                s.adaptive_samples,
                evidence,
                s.adaptive_evidence,
                round(time.time(), 3),
                sample.rendered_items,
                int(sample.suspect),
            ],
        )
        return _text(new)

    def decisions(self, evidence: int = 3) -> list[Decision]:
        """Every (endpoint, pattern) with its counters and its newest `evidence` samples."""
        members = sorted(_text(m) for m in self.r.smembers(self.ks.adaptive_index))
        pairs = [tuple(m.split(" ", 1)) for m in members if " " in m]
        pipe = self.r.pipeline(transaction=False)
        for endpoint, pattern in pairs:
            pipe.hgetall(self._key(endpoint, pattern))
            pipe.lrange(self._key(endpoint, pattern, "evidence"), 0, max(0, evidence - 1))
        got = pipe.execute()
        out = []
        for i, (endpoint, pattern) in enumerate(pairs):
            h = {_text(k): _text(v) for k, v in (got[2 * i] or {}).items()}
            if not h:
                continue
            n = {
                k: int(h.get(k, 0) or 0)
                for k in ("pages", "fetched", "rendered", "samples", "same", "differ", "changes")
            }
            ev = tuple(orjson.loads(e) for e in got[2 * i + 1] or ())
            at = float(h["decided_at"]) if h.get("decided_at") else None
            out.append(
                Decision(
                    endpoint, pattern, h.get("decision", LEARNING), decided_at=at, evidence=ev, **n
                )
            )
        return out

    def forget(self, endpoint: str, pattern: str) -> None:
        """Start learning this pattern again."""
        self.r.delete(self._key(endpoint, pattern), self._key(endpoint, pattern, "evidence"))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
