"""The process-wide ``DataProtoConfig`` switch that verl keeps beside DataProto.
Import it from :mod:`rlcore.protocol`."""

from __future__ import annotations

import os
from typing import ClassVar

from rlcore.errors import DataProtoError


class _DataProtoConfigMeta(type):
    _config: ClassVar[dict[str, bool]] = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        """On when set here or by verl's ``VERL_AUTO_PADDING`` = true/1 (a run sets it from
        ``trainer.auto_padding``, where ``RLCORE_AUTO_PADDING`` maps to)."""
        by_env = os.environ.get("VERL_AUTO_PADDING", "").strip().upper() in ("TRUE", "1")
        return by_env or cls._config.get(cls.auto_padding_key, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            msg = f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}"
            raise DataProtoError(msg)
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto switches, as verl: ``DataProtoConfig.auto_padding = True`` lets
    every DataProto :meth:`~DataProto.chunk` unevenly."""
