"""rlcore-fsdp2: a training engine on torch FSDP2 (``fully_shard``), CPU (gloo) or GPU (NCCL).

The engine class lives in :mod:`rlcore_fsdp2.engine` and is imported only when a config selects
``name = "fsdp2"``; this package imports nothing heavy.
"""
