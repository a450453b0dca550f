"""Metrics, dead letters, progress and status views, alerts."""
