"""demo app: the app JSON API, `{"code": 0, "data": ...}`, page/size paging; needs a device id
and a signature when the site checks them."""
