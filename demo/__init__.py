"""DemoNews: the local demo platform that the demo crawl, integration tests and benchmarks hit.

Public API:
  DemoConfig       every setting (CLI flags, --config file, DEMO_* env)
  DemoServer       run one in a subprocess on a free port (context manager)
  expected_counts  items and pages a complete crawl must find
  Dataset          the deterministic data, computed per id
  build_app        the aiohttp application, for in-process use
  signing.sign / signing.signed, captcha.solve: reference implementations of the protocols
The URL API, protocols and formulas are documented in demo/README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from demo.config import FEATURES, SIZE_PRESETS, DemoConfig
from demo.data import Dataset, expected_counts

if TYPE_CHECKING:
    from aiohttp import web

    from demo.testing import DemoServer

__all__ = [
    "FEATURES",
    "SIZE_PRESETS",
    "Dataset",
    "DemoConfig",
    "DemoServer",
    "build_app",
    "expected_counts",
]


def build_app(config: DemoConfig | None = None) -> web.Application:
    from demo.server import build_app as _build

    return _build(config)


def __getattr__(name: str) -> Any:
    if name == "DemoServer":  # imported lazily: it pulls in subprocess/urllib machinery
        from demo.testing import DemoServer

        return DemoServer
    raise AttributeError(name)
