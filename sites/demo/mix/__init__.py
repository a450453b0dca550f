"""demo mix: one site whose page types are static HTML or filled by script, crawled by
endpoints written once against a `Response` (`render="auto"`).

The mix front end (demo/README.md, "The mix front") serves the pc feed and post pages either
as HTML or as the js front's shells its script fills after load, per page type, and can switch
while a crawl runs. Each endpoint parses the pc markup with `css`; the framework learns per URL
pattern whether a plain fetch yields what the browser does and renders only where it does not.
"""
