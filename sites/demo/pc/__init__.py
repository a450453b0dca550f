"""demo pc: HTML pages (GBK user pages), page-numbered, parsed with parsel CSS selectors."""
