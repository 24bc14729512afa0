"""Algorithm-agnostic RL numerics shared by the algorithm plugins (PPO, GRPO, RLOO, ...).

Pure torch functions on ``(B, R)`` response-aligned tensors (see :mod:`rlcore.interfaces` for
the names), plus :class:`rlcore.rl.algorithm.PolicyGradientAlgorithm`, the base the plugins
subclass. Modules:

- :mod:`rlcore.rl.masked`: masked sum / mean / variance / whitening.
- :mod:`rlcore.rl.advantages`: GAE, GRPO, RLOO, REINFORCE++ (with and without group baseline).
- :mod:`rlcore.rl.losses`: loss aggregation, the policy losses (PPO clipped, GSPO, CISPO, GPG,
  SAPO, GMPO, KL-Cov) with their shared tail, value loss.
- :mod:`rlcore.rl.registry`: policy losses and advantage estimators by name (verl's
  ``register_policy_loss`` / ``register_adv_est``), one signature each; the core's own are
  registered in :mod:`rlcore.builtin` through the plugin hooks.
- :mod:`rlcore.rl.kl`: KL estimators (k1, abs, k2, k3 and ``+`` variants), KL controllers,
  KL penalty in the reward.

This package imports torch, so ``rlcore/__init__.py`` never imports it; nothing is re-exported
here so that ``import rlcore.rl.algorithm`` loads only what it needs.
"""
