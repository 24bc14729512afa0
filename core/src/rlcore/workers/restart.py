"""Replace a worker group's processes in place: same pool, same bundles, same worker class.

What is left of the old group is killed first (a stopped process too: ``ray.kill`` sends
SIGKILL, which a stopped process cannot ignore), its place on the pool is given back, and a
new group of the same class, init arguments and timeouts starts in the same bundles. The
caller loads what the new processes need (weights, a bridge) — see
:meth:`rlcore.trainer.placement.SplitPolicy.replace_rollout`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlcore.workers.worker_group import RayWorkerGroup

log = logging.getLogger(__name__)

__all__ = ["restart_group"]


def restart_group(group: RayWorkerGroup) -> RayWorkerGroup:
    """Kill ``group``'s actors and start a fresh group in their bundles; the new group."""
    from rlcore.workers.worker_group import RayWorkerGroup

    pool, cls_with_init, role, runtime_env, who = group._restart_args
    old_pids = [info["pid"] for info in group.__dict__.get("process_info") or []]
    group.shutdown()  # kills every rank and detaches from the pool
    new = RayWorkerGroup(
        pool,
        cls_with_init,
        role=role,
        runtime_env=runtime_env,
        who=who,
        call_timeout_s=group.call_timeout_s,
        start_timeout_s=group._start_timeout_s,
        heartbeat_timeout_s=group._heartbeat_timeout_s,
    )
    log.warning(
        "role %s: replaced processes %s with %s on pool %r",
        role,
        old_pids,
        [info["pid"] for info in new.process_info],
        pool.name,
    )
    return new
