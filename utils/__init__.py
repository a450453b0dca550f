"""Small shared helpers with no business logic."""
