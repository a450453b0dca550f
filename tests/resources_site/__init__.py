"""Test helpers for the resource pools against the demo platform (not a user site)."""
