"""What runs inside a Ray role worker, and the spec values it receives from the driver.

A module here is imported by a worker process: it may hold device state, is built from a
pickled spec (:mod:`rlcore.roles.specs`) and never reads the run config, the driver
(:mod:`rlcore.trainer`) or a preflight check (:mod:`rlcore.preflight`).

- :mod:`rlcore.roles.policy` — actor + rollout + reference in one process;
- :mod:`rlcore.roles.critic` — the value model;
- :mod:`rlcore.roles.rollout_worker` — the rollout on a pool of its own;
- :mod:`rlcore.roles.reward_model`, :mod:`rlcore.roles.extra_roles`,
  :mod:`rlcore.roles.frozen_model` — frozen models scoring the policy's rows;
- :mod:`rlcore.roles.generation_roles` — the batched rewards' generation roles (a judge);
- :mod:`rlcore.roles.update` — a role's update (mini-batches, epochs, LR schedule), with its
  levers (:mod:`rlcore.roles.levers`) and the rollout mismatch tally
  (:mod:`rlcore.roles.mismatch`);
- :mod:`rlcore.roles.mesh` — each engine's data-parallel place.
"""
