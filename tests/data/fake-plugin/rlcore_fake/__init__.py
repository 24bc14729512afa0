"""Fake rlcore plugins for discovery and config tests (names all start with ``fake``)."""
