"""Test doubles for the fetch layer (after httpx's MockTransport): no network, no Redis.

    fetcher = FixtureFetcher({"/h5/api/feed": "tests/sites/demo/h5/fixtures/feed.json"})
    items, follows = run_endpoint("demo.h5.feed", {}, fetcher)

Parser tests feed an endpoint saved pages this way, the way a team tests a real site.

A *recorded case* is the other way to get saved pages: `control.sh parse TASK PARAMS
--save-fixture` runs the endpoint live and keeps, in the endpoint's fixture folder
(`fixture_dir`), the parameters, every answer it received and what it yielded:

    fixtures/<endpoint>/case.json     {"task", "params", "answers": [...], "outputs": {...}}
    fixtures/<endpoint>/1.html        the body of the first answer, as received

`load_case(folder).fetcher()` replays the answers offline; `Case.outputs` is what the endpoint
yielded when they were recorded. Only the status, the content type and the final URL of an
answer are kept: no request headers, no cookies, no credentials.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import orjson
from urllib3 import HTTPHeaderDict

from exceptions import NotFound
from external_interface.fetch import FetchRequest, Response, header_charset
from external_interface.fetch.response import full_url

_TYPES = {".json": "application/json", ".html": "text/html", ".htm": "text/html"}
_SUFFIXES = {"json": ".json", "html": ".html", "xhtml": ".html", "xml": ".xml", "plain": ".txt",
             "javascript": ".js", "csv": ".csv"}  # fmt: skip
CASE_FILE = "case.json"


class MockFetcher:
    """Answers every request with `handler(request)`; records what was asked."""

    def __init__(self, handler: Callable[[FetchRequest], Response]) -> None:
        self.handler = handler
        self.requests: list[FetchRequest] = []

    def fetch(self, req: FetchRequest) -> Response:
        self.requests.append(req)
        return self.handler(req)


class FixtureFetcher(MockFetcher):
    """Serves saved files by URL path (a regex matched against the path, or an exact path)."""

    def __init__(self, routes: Mapping[str, str | Path | bytes], status: int = 200) -> None:
        self.routes = [
            (re.compile(k if k.startswith("^") else re.escape(k) + "$"), v)
            for k, v in routes.items()
        ]
        self.status = status
        super().__init__(self._serve)

    def _serve(self, req: FetchRequest) -> Response:
        path = urlsplit(req.url).path
        for pattern, src in self.routes:
            if pattern.search(path):
                if isinstance(src, bytes):
                    body, ctype = src, "text/html"
                else:
                    p = Path(src)
                    body, ctype = p.read_bytes(), _TYPES.get(p.suffix, "text/plain")
                return Response(
                    url=req.url,
                    status=self.status,
                    headers=HTTPHeaderDict({"content-type": ctype}),  # any case, as live
                    content=body,
                    elapsed=0.0,
                )
        raise NotFound(f"no fixture for {path}", status=404, url=req.url)


# --- recorded cases ----------------------------------------------------------------------------


def fixture_dir(task: str, tests_root: Path | str) -> Path:
    """An endpoint's recorded case: `tests/sites/<site>/<platform>/fixtures/<endpoint>/`, beside
    the parser test `control.sh new-site` writes (`site.platform.endpoint` task names)."""
    parts = task.split(".")
    if len(parts) < 2 or not all(parts):
        raise ValueError(f"task name {task!r} must look like site.platform.endpoint")
    platform, rest = (parts[1], parts[2:]) if len(parts) > 2 else ("common", parts[1:])
    return Path(tests_root) / "sites" / parts[0] / platform / "fixtures" / "_".join(rest)


@dataclass
class Answer:
    """One recorded answer: to which request, what came back, and the file holding the body."""

    method: str
    url: str  # as sent, query included, credentials removed
    status: int
    content_type: str
    final_url: str
    body: str


@dataclass
class Case:
    """An endpoint's recorded run: its parameters, its answers, what it yielded."""

    dir: Path
    task: str
    params: dict[str, Any]
    answers: list[Answer]
    outputs: dict[str, Any] = field(default_factory=dict)
    # the settings the page was recorded under (the site's base URL variable; None: unset),
    # so a replay builds the same URLs from `base_url()` as the recording did
    env: dict[str, str | None] = field(default_factory=dict)

    def fetcher(self) -> ReplayFetcher:
        return ReplayFetcher(self)


def outputs_of(items: Iterable[Any], follows: Iterable[Any]) -> dict[str, Any]:
    """Items and follow-ups as a case keeps them (`Item`s and `Follow`s, read by duck typing:
    this module sits below the endpoint contract)."""
    return {
        "items": [{"type": it.item_type, "item": it.model_dump(mode="json")} for it in items],
        "follows": [dict(f.params) for f in follows],
    }


def save_case(
    folder: Path | str,
    task: str,
    params: Mapping[str, Any],
    exchanges: Sequence[tuple[FetchRequest, Response]],
    outputs: Mapping[str, Any],
    env: Mapping[str, str | None] | None = None,
) -> list[Path]:
    """Write a case (replacing the one recorded before); -> the files written. `env`: the
    variables the replay sets as they were (the site's base URL), None for unset."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        for old in load_case(folder).answers:  # the bodies this module wrote before
            (folder / old.body).unlink(missing_ok=True)
    answers, written = [], []
    for i, (req, resp) in enumerate(exchanges, 1):
        ctype = resp.headers.get("content-type", "")
        body = f"{i}{_suffix(ctype)}"
        (folder / body).write_bytes(resp.content)
        written.append(folder / body)
        answers.append(
            Answer(
                req.method.upper(),
                _no_credentials(full_url(req.url, req.params)),
                resp.status,
                ctype,
                _no_credentials(resp.url),
                body,
            )
        )
    case = {
        "task": task,
        "params": dict(params),
        "answers": [asdict(a) for a in answers],
        "outputs": dict(outputs),
        **({"env": dict(env)} if env else {}),
    }
    path = folder / CASE_FILE
    path.write_bytes(orjson.dumps(case, option=orjson.OPT_INDENT_2) + b"\n")
    return [path, *written]


def load_case(folder: Path | str) -> Case:
    """The case recorded in `folder` (FileNotFoundError when there is none)."""
    folder = Path(folder)
    data = orjson.loads((folder / CASE_FILE).read_bytes())
    return Case(
        folder,
        data["task"],
        data["params"],
        [Answer(**a) for a in data["answers"]],
        data.get("outputs") or {},
        data.get("env") or {},
    )


class ReplayFetcher(MockFetcher):
    """Answers each request with the recorded answer to the same method and path (any host:
    the site's base URL may differ between recording and replay) whose query
    holds every argument of the request's (providers may have added some when it was
    recorded: a signature, a timestamp), in recorded order; a request asked more often than
    it was recorded gets its last answer again."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self._used: set[int] = set()
        super().__init__(self._serve)

    def _serve(self, req: FetchRequest) -> Response:
        method, path, query = _parts(req.method, full_url(req.url, req.params))
        fits = [
            i
            for i, a in enumerate(self.case.answers)
            if _parts(a.method, a.url)[:2] == (method, path)
            and not query - _parts(a.method, a.url)[2]
        ]
        if not fits:
            asked = ", ".join(f"{a.method} {a.url}" for a in self.case.answers)
            raise NotFound(
                f"no recorded answer for {method} {req.url} in {self.case.dir} (recorded: {asked})",
                status=404,
                url=req.url,
            )
        i = next((i for i in fits if i not in self._used), fits[-1])
        self._used.add(i)
        a = self.case.answers[i]
        return Response(
            url=a.final_url,
            status=a.status,
            headers=HTTPHeaderDict({"content-type": a.content_type}),
            content=(self.case.dir / a.body).read_bytes(),
            elapsed=0.0,
            declared_encoding=header_charset(a.content_type),
        )


def _parts(method: str, url: str) -> tuple[str, str, Counter[tuple[str, str]]]:
    u = urlsplit(url)
    return method.upper(), u.path or "/", Counter(parse_qsl(u.query, True))


def _suffix(content_type: str) -> str:
    subtype = content_type.split(";")[0].strip().lower().rpartition("/")[2]
    for key, suffix in _SUFFIXES.items():
        if subtype == key or subtype.endswith("+" + key):
            return suffix
    return ".bin"


def _no_credentials(url: str) -> str:
    u = urlsplit(url)
    if "@" not in u.netloc:
        return url
    return urlunsplit(u._replace(netloc=u.netloc.rpartition("@")[2]))
