"""rlcore-sglang: a rollout on SGLang's offline ``Engine`` (CUDA GPU).

The rollout class lives in :mod:`rlcore_sglang.rollout` and is imported only when a config
selects ``name = "sglang"``; SGLang itself is imported only when that class is constructed, so
discovery and ``rlcore config validate`` work on machines without SGLang or a GPU. The
translation between rlcore's tensors and SGLang's requests/outputs is in
:mod:`rlcore_sglang.translate` (pure functions, tested on CPU).
"""
