"""demo h5: the mobile JSON API, `{"ok": 1, "data": ...}`, cursor paging."""
