"""Adapters to the services a crawler leans on: proxies, cookies, devices, sign, dedup, storage."""
