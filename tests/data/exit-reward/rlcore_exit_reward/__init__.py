"""A test reward: response-length parity, and ``sys.exit(3)`` once ``$RLCORE_TEST_EXIT_MARKER``
exists (tests only)."""
