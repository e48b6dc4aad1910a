"""One file per routing policy; each registers itself by name."""
