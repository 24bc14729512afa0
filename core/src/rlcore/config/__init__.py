"""Run configuration: TOML -> attrs via cattrs, overrides, plugin sections, batch arithmetic.

``load_config(path, overrides)`` returns a fully resolved :class:`RunConfig`;
``dump_toml(config_to_dict(cfg))`` writes it back (``rlcore config show``).
"""

from __future__ import annotations

from rlcore.config import loader, schema
from rlcore.config.dump import config_to_dict, dump_toml, unset_keys
from rlcore.config.loader import *  # noqa: F403
from rlcore.config.schema import *  # noqa: F403

# What loader and schema declare public, re-exported: a new class or function is listed once,
# in the ``__all__`` of the module that defines it (the package used to repeat both lists).
__all__ = [*loader.__all__, *schema.__all__, "config_to_dict", "dump_toml", "unset_keys"]
