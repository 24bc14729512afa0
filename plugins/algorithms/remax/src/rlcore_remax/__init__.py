"""ReMax (arXiv 2310.10505) as an rlcore algorithm plugin, written against the public API only."""
