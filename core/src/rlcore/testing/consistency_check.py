"""``rlcore check consistency CONFIG``: the configured rollout against the actor engine.

Runs in the command's own process, without Ray: a 1-rank process group, the actor engine
and the rollout built from the specs ``rlcore train`` would hand the policy worker, the
engine's weights synced into the rollout as after a training step, responses to the first
``prompts`` prompts of ``data.train_files`` sampled as in training, then
:func:`rlcore.testing.conformance.measure_consistency` on them. Prints the table; the exit
code is 1 when the distributions drift past the bound.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from rlcore.errors import ConfigError

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.plugins import PluginRegistry
    from rlcore.testing.conformance import ConsistencyReport

__all__ = ["run_consistency_check"]

EXIT_DRIFT = 1


@contextlib.contextmanager
def _one_rank_group(device: str) -> Iterator[None]:
    """A private 1-rank process group (an in-memory store: no socket), unless one exists."""
    import torch.distributed as dist

    from rlcore.engine.device import process_group_backend

    if dist.is_initialized():
        yield
        return
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group(
        process_group_backend(device), store=store, rank=0, world_size=1
    )
    try:
        yield
    finally:
        if dist.is_initialized():  # a rollout's shutdown (vLLM's) may have ended it already
            dist.destroy_process_group()


def consistency_report(
    config: RunConfig,
    *,
    prompts: int,
    kl_bound: float,
    layer_bound: float,
    top_k: int,
    registry: PluginRegistry | None = None,
) -> ConsistencyReport:
    """Build the run's actor engine and rollout on the same weights and compare them."""
    import attrs

    from rlcore.data import build_datasets, load_tokenizer
    from rlcore.data.loader import collate_prompts
    from rlcore.preflight.hub import resolve_hub_names
    from rlcore.testing.conformance import measure_consistency
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    if prompts < 1:
        raise ConfigError(f"--prompts must be >= 1, got {prompts}")
    config = resolve_hub_names(config)
    tokenizer = load_tokenizer(
        config.model.tokenizer_path, require_chat_template=config.data.apply_chat_template
    )
    # Only the first prompts are used: a data set smaller than a training batch is fine here.
    config = attrs.evolve(config, data=attrs.evolve(config.data, train_batch_size=1))
    train_set, _ = build_datasets(config, tokenizer)
    n = min(prompts, len(train_set))
    batch = collate_prompts(train_set, list(range(n)), [str(i) for i in range(n)])
    specs = build_specs(config, build_algorithm(config, registry), 1, registry=registry)
    policy = specs.policy
    sampling = config.rollout.sampling(config.data.max_response_length)
    with _one_rank_group(config.resources.device):
        engine = policy.actor.engine.build(policy.actor.spec)
        rollout = policy.rollout.build(policy.rollout_spec)
        # As the policy worker does after every update: the rollout serves the engine's weights.
        rollout.update_weights(engine.named_parameters_for_sync())
        rows = rollout.generate(batch, sampling)
        try:
            report = measure_consistency(
                rollout, engine, rows, kl_bound=kl_bound, layer_bound=layer_bound, top_k=top_k
            )
        except NotImplementedError as err:  # a plugin without next_token_distributions
            raise ConfigError(f"{err} ([rollout] name, [actor.engine] name)") from None
        shutdown = getattr(rollout, "shutdown", None)
        if callable(shutdown):
            shutdown()
    return report


def run_consistency_check(
    config: RunConfig,
    *,
    prompts: int = 8,
    kl_bound: float = 1e-3,
    layer_bound: float = 1e-2,
    top_k: int = 10,
    registry: PluginRegistry | None = None,
    out: TextIO | None = None,
) -> int:
    """Print the report's table; 0 within ``kl_bound``, :data:`EXIT_DRIFT` past it."""
    report = consistency_report(
        config,
        prompts=prompts,
        kl_bound=kl_bound,
        layer_bound=layer_bound,
        top_k=top_k,
        registry=registry,
    )
    print(report.table(), file=out or sys.stdout)
    return 0 if report.passed else EXIT_DRIFT
