"""Assemble the aiohttp application and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import tempfile
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from demo import appapi, h5, jsfront, misc, mixed, pc
from demo.config import DemoConfig
from demo.guard.cert import make_certificates
from demo.guard.front import GuardFront
from demo.guards import pipeline
from demo.state import STATE, DemoState

log = logging.getLogger("demo")


def build_app(config: DemoConfig | None = None) -> web.Application:
    """The whole platform as one aiohttp app (usable with aiohttp's test client too)."""
    app = web.Application(middlewares=[pipeline], client_max_size=1024 * 1024)
    app[STATE] = DemoState(config or DemoConfig())
    for module in (pc, h5, appapi, jsfront, mixed, misc):
        app.router.add_routes(module.routes)
    return app


def _raise_fd_limit() -> None:
    """Thousands of concurrent connections need thousands of file descriptors."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 65536
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, 1 << 20), hard))


async def serve(config: DemoConfig, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then close connections and return."""
    app = build_app(config)
    access_log = logging.getLogger("aiohttp.access") if config.access_log else None
    runner = web.AppRunner(app, access_log=access_log, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(
        runner,
        config.host,
        config.port,
        backlog=config.backlog,
        reuse_address=True,
        shutdown_timeout=2.0,
    )
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    front = await _guard(config, url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
    finally:
        if front is not None:
            await front.stop()
        await runner.cleanup()


async def _guard(config: DemoConfig, backend: str) -> GuardFront | None:
    """The guarded front (demo/guard/) when `guard_port` is set: TLS + HTTP/2 behind a browser
    check, with a CA made on the spot unless a certificate is given (its path logged)."""
    if config.guard_port is None:
        return None
    cert, key = config.guard_cert, config.guard_key
    if not (cert and key):
        made = make_certificates(tempfile.mkdtemp(prefix="demo-guard-"))
        cert, key = str(made.cert), str(made.key)
        print(f"demo guarded front CA: {made.ca} (made for this run)", flush=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    front = GuardFront(backend, ctx, config.host, config.guard_port)
    port = await front.start()
    print(f"demo guarded front at https://{config.host}:{port} (HTTP/2, browsers only)", flush=True)
    return front


def run_loop(main: Coroutine[Any, Any, None], use_uvloop: bool = True) -> None:
    """asyncio.run, on uvloop when it is installed and wanted."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(main)
            return
    asyncio.run(main)


def run(config: DemoConfig) -> None:
    """Foreground server: prints one ready line with the URL to stdout."""
    _raise_fd_limit()
    if config.access_log:
        logging.basicConfig(level=logging.INFO, format="%(message)s")

    def ready(url: str) -> None:
        features = ",".join(sorted(config.features)) or "none"
        print(
            f"demo server ready at {url} (size={config.size} users={config.users} "
            f"posts_per_user={config.posts_per_user} comments_per_post={config.comments_per_post} "
            f"features={features})",
            flush=True,
        )

    run_loop(serve(config, ready), config.use_uvloop)
