"""Run configuration: TOML -> attrs via cattrs, overrides, plugin sections, batch arithmetic.

``load_config(path, overrides)`` returns a fully resolved :class:`RunConfig`;
``dump_toml(config_to_dict(cfg))`` writes it back (``rlcore config show``).
"""

from __future__ import annotations

from rlcore.config.dump import config_to_dict, dump_toml, unset_keys
from rlcore.config.loader import (
    ConfigValidationError,
    apply_overrides,
    build_config,
    load_config,
    load_config_text,
    read_toml,
    validate,
)
from rlcore.config.schema import (
    LOGGERS,
    ActorConfig,
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    PluginsConfig,
    PluginSection,
    RefConfig,
    ResourcesConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
    ValSamplingConfig,
)

__all__ = [
    "LOGGERS",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigValidationError",
    "CriticConfig",
    "DataConfig",
    "ModelConfig",
    "PluginSection",
    "PluginsConfig",
    "RefConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "ValSamplingConfig",
    "apply_overrides",
    "build_config",
    "config_to_dict",
    "dump_toml",
    "load_config",
    "load_config_text",
    "read_toml",
    "unset_keys",
    "validate",
]
