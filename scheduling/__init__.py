"""Scheduling across workers: shared rate limits and concurrency caps, periodic chains."""
