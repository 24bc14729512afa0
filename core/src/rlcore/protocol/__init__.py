"""The protocol between the driver and the workers: :class:`DataProto` with verl's API.

One package of one idea, each module one part of it, imported in one direction
(``dataproto`` uses ``helpers``, ``settings`` and ``serialize``; ``padding`` and
``tensordict_bridge`` work on a DataProto without being imported by it):

- :mod:`~rlcore.protocol.dataproto` — the class (construction, indexing, select/union,
  chunk/concat, repeat, iteration, disk files);
- :mod:`~rlcore.protocol.padding` — verl's module functions ``pad_dataproto_to_divisor``,
  ``unpad_dataproto``, ``fold_batch_dim``, ``unfold_batch_dim``;
- :mod:`~rlcore.protocol.settings` — the process-wide ``DataProtoConfig.auto_padding``;
- :mod:`~rlcore.protocol.serialize` — tensors as numpy buffers through Ray, pickle-free files;
- :mod:`~rlcore.protocol.tensordict_bridge` — ``to_tensordict``/``from_tensordict``.

Import the public names from here (``from rlcore.protocol import DataProto``), as verl code does
from ``verl.protocol``.
"""

from __future__ import annotations

from rlcore.protocol.dataproto import DataProto, DataProtoItem
from rlcore.protocol.helpers import DataProtoIndexError
from rlcore.protocol.padding import (
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)
from rlcore.protocol.settings import DataProtoConfig

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoIndexError",
    "DataProtoItem",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "unpad_dataproto",
]
