"""Algorithm-agnostic RL numerics shared by the algorithm plugins (PPO, GRPO, RLOO, ...).

Pure torch functions on ``(B, R)`` response-aligned tensors (see :mod:`rlcore.interfaces` for
the names), plus :class:`rlcore.rl.algorithm.PolicyGradientAlgorithm`, the base the plugins
subclass. Modules:

- :mod:`rlcore.rl.masked`: masked sum / mean / variance / whitening.
- :mod:`rlcore.rl.advantages`: GAE, GRPO, RLOO, REINFORCE++ (with and without group baseline).
- :mod:`rlcore.rl.losses`: loss aggregation, PPO clipped / GSPO policy losses, value loss.
- :mod:`rlcore.rl.kl`: KL estimators (k1, abs, k2, k3 and ``+`` variants), KL controllers,
  KL penalty in the reward.

This package imports torch, so ``rlcore/__init__.py`` never imports it; nothing is re-exported
here so that ``import rlcore.rl.algorithm`` loads only what it needs.
"""
