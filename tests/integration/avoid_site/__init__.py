"""An endpoint lent a device from a pool, for tests/integration/test_avoid_starvation.py."""
