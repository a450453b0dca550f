"""Captcha recognition: one small interface, a local recognizer per captcha format, and a
client for an external solving service, with failures counted and retried.

    rec = get_recognizer("demo", "ascii-5x7")
    answer = solve(Challenge(image, "ascii-5x7", length=4), site="demo")   # None if unsolved

Which recognizer serves a site: env `CHAINCRAWL_CAPTCHA_<SITE>` (or `CHAINCRAWL_CAPTCHA`) names
one registered in `recognizers` ("ascii-5x7", "http"); otherwise the one registered for the
challenge's format. Counters per site live in `<p>:captcha:stats:<site>` (solved, failed,
failed:<Error>, accepted, rejected) so a run shows how often recognition or the site said no.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis
import requests

from config import get_settings, site_env
from exceptions import ConfigError, CrawlError, Policy
from utils.redis import as_str, get_redis
from utils.registry import Registry

log = logging.getLogger(__name__)


class CaptchaUnsolved(CrawlError):
    """Recognition gave no answer. `transient` failures (a service hiccup) are worth a retry."""

    policy = Policy.RETRY
    transient = False


class CaptchaServiceError(CaptchaUnsolved):
    """The external solving service failed or timed out."""

    transient = True


@dataclass(frozen=True)
class Challenge:
    image: str
    format: str = "ascii-5x7"
    length: int | None = None


class Recognizer(Protocol):
    name: str

    def recognize(self, challenge: Challenge) -> str: ...


# --- the dot-matrix recognizer (demo/README.md, section 8.5) ------------------------------

GLYPHS: dict[str, tuple[str, ...]] = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
}


class DotMatrixRecognizer:
    """Fixed-width 5x7 digit cells separated by one blank column; each cell is matched to the
    nearest glyph (exact for the demo's clean images, tolerant of a few flipped dots)."""

    name = "ascii-5x7"

    def __init__(
        self,
        glyphs: dict[str, tuple[str, ...]] | None = None,
        gap: int = 1,
        ink: str = "#",
        max_distance: int = 4,
    ) -> None:
        self.glyphs = glyphs or GLYPHS
        first = next(iter(self.glyphs.values()))
        self.height, self.width = len(first), len(first[0])
        self.gap, self.ink, self.max_distance = gap, ink, max_distance
        self._bits = {ch: self._pack(rows) for ch, rows in self.glyphs.items()}

    def _pack(self, rows: tuple[str, ...] | list[str]) -> int:
        bits = 0
        for row in rows:
            for c in row:
                bits = (bits << 1) | (c == self.ink)
        return bits

    def recognize(self, challenge: Challenge) -> str:
        rows = challenge.image.split("\n")
        if len(rows) != self.height or len({len(r) for r in rows}) != 1:
            raise CaptchaUnsolved(f"image is not {self.height} rows of equal width")
        pitch = self.width + self.gap
        count = (len(rows[0]) + self.gap) // pitch
        if count * pitch - self.gap != len(rows[0]) or count == 0:
            raise CaptchaUnsolved(f"image width {len(rows[0])} is not n*{pitch}-{self.gap}")
        if challenge.length is not None and count != challenge.length:
            raise CaptchaUnsolved(f"found {count} cells, expected {challenge.length}")
        out = []
        for i in range(count):
            start = i * pitch
            cell = self._pack([r[start : start + self.width] for r in rows])
            best, dist = min(
                ((ch, (cell ^ bits).bit_count()) for ch, bits in self._bits.items()),
                key=lambda x: x[1],
            )
            if dist > self.max_distance:
                raise CaptchaUnsolved(f"cell {i} matches no glyph (nearest off by {dist} dots)")
            out.append(best)
        return "".join(out)


# --- an external solving service ----------------------------------------------------------


class HttpSolver:
    """Client of a solving service speaking a small JSON protocol:

        POST {url}/solve  {"format", "image", "length"}  (Authorization: Bearer <key>)
          -> {"answer": "1234"}                      solved at once, or
          -> {"id": "abc", "status": "pending"}      then poll GET {url}/result/{id}
               -> {"status": "pending"} | {"status": "ready", "answer": "1234"}
                  | {"status": "failed", "error": "..."}

    Transport errors, 5xx and timeouts raise CaptchaServiceError (transient, retried);
    a definite "cannot solve" raises CaptchaUnsolved.
    """

    name = "http"

    def __init__(
        self,
        url: str,
        key: str = "",
        timeout: float = 30.0,
        poll_interval: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._key = key
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.session = session or requests.Session()
        self.session.trust_env = False

    def __repr__(self) -> str:
        return f"HttpSolver({self.url!r})"

    @classmethod
    def from_env(cls, site: str = "") -> HttpSolver:
        def env(name: str, default: str = "") -> str:
            return site_env("captcha_service", site, field=name) or default

        url = env("URL")
        if not url:
            raise ConfigError("no captcha service: set CHAINCRAWL_CAPTCHA_SERVICE_URL")
        return cls(url, env("KEY"), float(env("TIMEOUT", "30")))

    def _call(self, method: str, path: str, deadline: float, **kw: object) -> dict:
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        left = max(0.1, deadline - time.monotonic())
        try:
            r = self.session.request(method, self.url + path, headers=headers, timeout=left, **kw)  # type: ignore[arg-type]
        except requests.RequestException as exc:
            raise CaptchaServiceError(
                f"captcha service unreachable: {type(exc).__name__}"
            ) from None
        if r.status_code >= 500 or r.status_code == 429:
            raise CaptchaServiceError(f"captcha service answered {r.status_code}")
        try:
            data = r.json()
        except ValueError:
            raise CaptchaServiceError("captcha service sent no JSON") from None
        if r.status_code >= 400 or not isinstance(data, dict):
            raise CaptchaUnsolved(f"captcha service refused: {str(data)[:100]}")
        return data

    def recognize(self, challenge: Challenge) -> str:
        deadline = time.monotonic() + self.timeout
        body = {"format": challenge.format, "image": challenge.image, "length": challenge.length}
        data = self._call("POST", "/solve", deadline, json=body)
        while True:
            if data.get("answer"):
                return str(data["answer"])
            status = data.get("status")
            if status == "failed" or data.get("error"):
                raise CaptchaUnsolved(
                    f"captcha service could not solve: {data.get('error', status)}"
                )
            if status != "pending" or not data.get("id", ""):
                raise CaptchaServiceError("captcha service answered neither answer nor pending id")
            if time.monotonic() + self.poll_interval > deadline:
                raise CaptchaServiceError(f"captcha service gave no answer in {self.timeout}s")
            time.sleep(self.poll_interval)
            task_id = data["id"]
            data = self._call("GET", f"/result/{task_id}", deadline)
            data.setdefault("id", task_id)


# --- registry and selection ---------------------------------------------------------------

recognizers: Registry[Callable[[str], Recognizer]] = Registry("captcha recognizer")
recognizers.add("ascii-5x7", lambda site: DotMatrixRecognizer())
recognizers.add("http", HttpSolver.from_env)

_by_format: dict[str, str] = {"ascii-5x7": "ascii-5x7"}
_by_site: dict[str, str] = {}


def use_for_site(site: str, name: str) -> None:
    """Code-level choice of recognizer for a site (the environment still wins)."""
    _by_site[site] = name


def get_recognizer(site: str, fmt: str = "") -> Recognizer:
    name = site_env("captcha", site) or _by_site.get(site) or _by_format.get(fmt)
    if not name:
        raise CaptchaUnsolved(f"no captcha recognizer for site {site} / format {fmt!r}")
    return recognizers.get(name)(site)


# --- counting and retrying ----------------------------------------------------------------


class CaptchaStats:
    """Per-site counters in Redis: solved, failed, failed:<Error>, accepted, rejected."""

    def __init__(
        self, site: str, rds: redis.Redis | None = None, prefix: str | None = None
    ) -> None:
        self._rds = rds
        prefix = prefix if prefix is not None else get_settings().key_prefix
        self.key = f"{prefix}:captcha:stats:{site}"

    @property
    def rds(self) -> redis.Redis:
        return self._rds if self._rds is not None else get_redis()

    def count(self, *fields: str) -> None:
        pipe = self.rds.pipeline(transaction=False)
        for f in fields:
            pipe.hincrby(self.key, f, 1)
        pipe.execute()

    def read(self) -> dict[str, int]:
        return {as_str(k): int(v) for k, v in self.rds.hgetall(self.key).items()}


def captcha_stats(client: redis.Redis, prefix: str, site: str) -> dict[str, int]:
    return CaptchaStats(site, client, prefix).read()


def solve(
    challenge: Challenge,
    site: str,
    *,
    attempts: int = 3,
    recognizer: Recognizer | None = None,
    stats: CaptchaStats | None = None,
    backoff: float = 0.2,
) -> str | None:
    """The answer, or None when recognition failed `attempts` times (each failure counted;
    only transient ones are retried, a deterministic recognizer would fail the same way)."""
    stats = stats or CaptchaStats(site)
    for attempt in range(max(1, attempts)):
        try:
            rec = recognizer or get_recognizer(site, challenge.format)
            answer = rec.recognize(challenge)
        except CaptchaUnsolved as exc:
            stats.count("failed", f"failed:{type(exc).__name__}")
            log.info("captcha for %s not solved (attempt %d): %s", site, attempt + 1, exc)
            if not exc.transient:
                return None
            time.sleep(backoff * (2**attempt))
            continue
        stats.count("solved")
        return answer
    return None


def verdict(site: str, accepted: bool, stats: CaptchaStats | None = None) -> None:
    """Count what the site said about an answer (a rejected one means the recognizer erred)."""
    (stats or CaptchaStats(site)).count("accepted" if accepted else "rejected")
