"""rlcore-vllm: a rollout on the vLLM inference engine (CPU build or CUDA build).

The rollout class lives in :mod:`rlcore_vllm.rollout` and is imported only when a config selects
``name = "vllm"``; this package imports nothing heavy.
"""
