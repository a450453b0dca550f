"""Named chains for the CLI tests (CHAINCRAWL_EXTRA_CHAIN_PACKAGES)."""
