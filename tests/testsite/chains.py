"""Chains over the test site (imported by the integration tests)."""

from __future__ import annotations

from chains import Chain, step


def three_step(delay: float = 0.0) -> Chain:
    return Chain(
        "testsite_three",
        step("testsite.local.listing").then(
            step("testsite.local.detail", entry_id="entry_id"),
            step("testsite.local.reviews", entry_id="entry_id", const={"delay": delay}),
        ),
    )


def deep() -> Chain:
    """listing -> detail -> reviews: three levels deep with pagination at two of them."""
    return Chain(
        "testsite_deep",
        step("testsite.local.listing").then(
            step("testsite.local.detail", entry_id="entry_id").then(
                step("testsite.local.reviews", entry_id="entry_id")
            )
        ),
    )


def probe(path: str) -> Chain:
    return Chain(
        "testsite_probe",
        step("testsite.local.listing", options={"max_pages": 1}).then(
            step("testsite.local.probe", entry_id="entry_id", const={"path": path})
        ),
    )


def skip_seen(hours: float) -> Chain:
    """listing -> detail, where details crawled within `hours` (across runs) are skipped."""
    return Chain(
        "testsite_skip_seen",
        step("testsite.local.listing").then(
            step("testsite.local.detail", entry_id="entry_id", options={"skip_seen_hours": hours})
        ),
    )


def unique_details() -> Chain:
    """listing -> detail, where a detail reached twice in a run is sent once (`unique`)."""
    return Chain(
        "testsite_unique",
        step("testsite.local.listing").then(
            step("testsite.local.detail", entry_id="entry_id", options={"unique": True})
        ),
    )
