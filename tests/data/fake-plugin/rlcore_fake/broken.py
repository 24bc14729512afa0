"""A plugin module whose import fails, as when its distribution's dependency is missing."""

import rlcore_fake_nonexistent_dependency  # noqa: F401
