"""Named chains for the periodic-chain tests (CHAINCRAWL_EXTRA_CHAIN_PACKAGES)."""
