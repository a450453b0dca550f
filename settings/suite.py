"""Variables only the test suite reads: they are not settings of chaincrawl itself, but they
share the prefix, so the unknown-variable check must know them too."""

from __future__ import annotations

from pydantic import Field

from settings.base import ChaincrawlSettings


class SuiteSettings(ChaincrawlSettings):
    """Where the broker tests find RabbitMQ, which pool the torture workers run."""

    test_amqp_url: str = Field(
        "amqp://guest:guest@127.0.0.1:5672/",
        description="Test suite: the RabbitMQ the AMQP broker tests use (tests/amqp.py).",
    )
    torture_pool: str = Field(
        "",
        description="Test suite: the pool of the torture workers (tests/torture); empty: "
        "the default pool.",
    )


def get_suite_settings() -> SuiteSettings:
    """The test process's suite settings, read on first use."""
    return SuiteSettings.current()


def reset_suite_settings() -> None:
    """Forget the cached settings (a test that changes the environment calls this)."""
    SuiteSettings.forget()
