"""rlcore-hf: a rollout on Hugging Face transformers ``generate`` (CPU or GPU).

The rollout class lives in :mod:`rlcore_hf.rollout` and is imported only when a config selects
``name = "hf"``; this package imports nothing heavy.
"""
