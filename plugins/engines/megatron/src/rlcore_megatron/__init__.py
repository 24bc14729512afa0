"""rlcore-megatron: a training engine on megatron-core (tensor, pipeline, data parallelism).

The engine class lives in :mod:`rlcore_megatron.engine` and is imported only when a config
selects ``name = "megatron"``; this package imports nothing heavy. :mod:`rlcore_megatron.mapping`
converts Hugging Face Qwen2/Llama weights to megatron's layout and back.
"""
