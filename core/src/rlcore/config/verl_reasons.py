"""Why a verl key has no rlcore counterpart: the reason ``from-verl`` prints beside each key it
does not carry over, by family of keys (profiler, FSDP tuning, verl's runtime), so that a
user reads why and what to use instead rather than a bare "no rlcore key"."""

from __future__ import annotations

__all__ = ["WHY_NOT", "unmapped_reason"]

# fnmatch patterns on the dotted name, first match wins; docs/porting-from-verl.md lists the
# same table (tests/test_config_from_verl.py checks it).
WHY_NOT: tuple[tuple[str, str], ...] = (
    ("*profiler*", "rlcore has no profiler hooks: run torch.profiler or py-spy yourself"),
    (
        "*.fsdp_config.*",
        "FSDP option the fsdp2 engine does not take (it has offload_params, "
        "reshard_after_forward, fsdp_size)",
    ),
    ("*.megatron.*", "Megatron option: rlcore's megatron engine has its own [actor.engine] keys"),
    ("*.checkpoint.*", "rlcore saves weights, optimizer and run state every save_freq steps"),
    ("*router_replay*", "MoE router replay: not in rlcore"),
    ("*tiled_mlp*", "kernel option the fsdp2 engine does not expose"),
    ("*fused_kernel*", "kernel option the fsdp2 engine does not expose"),
    (
        "actor_rollout_ref.ref.use_torch_compile",
        "the reference's passes run eager; actor.compile compiles the update only",
    ),
    ("*ulysses_sequence_parallel_size", "rlcore has no sequence parallelism"),
    ("*.optim.optimizer*", "rlcore's engines use torch's AdamW"),
    ("*.optim.*", "optimizer option rlcore does not expose"),
    (
        "actor_rollout_ref.rollout.log_prob_*",
        "the actor recomputes old log-probs with actor.micro_batch_size / "
        "max_tokens_per_micro_batch",
    ),
    ("actor_rollout_ref.rollout.multi_turn.*", "rlcore's [agent] table (only with enable = true)"),
    (
        "actor_rollout_ref.rollout.agent.*",
        "verl's agent-loop workers; rlcore's [agent] runs inside the rollout",
    ),
    ("actor_rollout_ref.rollout.*", "inference-server option the rollout plugin does not take"),
    ("actor_rollout_ref.ref.*", "the reference reuses the actor's engine options ([ref.engine])"),
    ("actor_rollout_ref.hybrid_engine", "rlcore colocates the actor and rollout by default"),
    ("actor_rollout_ref.model.*", "model-loading option rlcore does not expose"),
    ("actor_rollout_ref.actor.*", "actor option rlcore does not expose"),
    (
        "critic.*",
        "critic option rlcore does not expose ([critic] takes model_path, optim, batches)",
    ),
    ("*sandbox_fusion*", "rlcore's code reward runs its own sandbox ([reward.options.code])"),
    ("*overlong_buffer*.log", "rlcore's dapo logs dapo/overlong_penalty/mean and overlong_frac"),
    ("*max_resp_len", "rlcore's dapo overlong buffer ends at data.max_response_length"),
    (
        "custom_reward_function.*",
        "rlcore loads rewards as plugins: wrap the function in one (rlcore new-plugin reward)",
    ),
    (
        "reward_model.*",
        "verl's reward model/manager: rlcore scores with [reward] plugins (a model-based "
        "one is a reward plugin too)",
    ),
    ("ray_kwargs.*", "rlcore starts Ray itself ([resources])"),
    ("transfer_queue.*", "rlcore moves batches through Ray's object store"),
    ("data.*", "dataset option rlcore does not expose (rlcore reads verl's row schema)"),
    ("algorithm.*", "algorithm option no rlcore algorithm has"),
    ("trainer.default_hdfs_dir", "rlcore writes checkpoints to trainer.run_dir only"),
    ("trainer.max_critic_ckpt_to_keep", "trainer.keep_last keeps every role's checkpoints"),
    ("trainer.critic_warmup", "rlcore trains the actor from the first step"),
    ("trainer.val_only", "rlcore has no validate-only mode"),
    ("trainer.*_generations", "rlcore logs no sample texts to trackers (trainer.rollout_data_dir)"),
    (
        "trainer.validation_data_dir",
        "rlcore logs no sample texts to trackers (trainer.rollout_data_dir)",
    ),
    ("trainer.*", "verl runtime option with no rlcore counterpart"),
    ("global_*", "verl runtime option with no rlcore counterpart"),
)


def unmapped_reason(key: str) -> str:
    """Why ``key`` (a verl dotted name) is not carried over."""
    from fnmatch import fnmatchcase

    for pattern, why in WHY_NOT:
        if fnmatchcase(key, pattern):
            return why
    return "no rlcore key"
