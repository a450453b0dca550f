"""One module per business chain; each calls `chains.define(name, root_step)`."""
