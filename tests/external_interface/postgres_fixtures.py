"""A private PostgreSQL for the tests (utils/pgserver.py): one server per test session, a fresh
database per test. Without PostgreSQL binaries or psycopg the tests that use it skip with the
reason; the machine's own PostgreSQL is never touched."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from utils.pgserver import PostgresServer, available


@contextlib.contextmanager
def private_server() -> Iterator[PostgresServer]:
    """A server of the caller's own (one it may stop and start: an outage), or a skip."""
    why = available()
    if why:
        pytest.skip(f"needs a PostgreSQL server: {why}")
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with private_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> Iterator[str]:
    """A database of this test's own on the session's server (dropped afterwards)."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
