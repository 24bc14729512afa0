"""Test support for rlcore and plugin authors (never imported by ``rlcore/__init__``)."""
