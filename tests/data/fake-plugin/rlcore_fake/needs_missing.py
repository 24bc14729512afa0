"""A component module that needs a backend which is not installed."""

import rlcore_fake_missing_backend  # noqa: F401
