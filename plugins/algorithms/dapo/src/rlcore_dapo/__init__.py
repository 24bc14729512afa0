"""DAPO (arXiv 2503.14476) as an rlcore algorithm plugin, written against the public API only."""
