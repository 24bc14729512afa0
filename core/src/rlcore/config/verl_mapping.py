"""The one table of verl's dotted names -> rlcore keys (:data:`MAPPING`), each with the transform
its value goes through (a list, a float, verl's loss-mode and schedule names, ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Transform = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def to_list(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else [value]


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def float_or_text(value: Any) -> Any:
    """A number as float (verl writes "2.0" in strings too); anything else as given, for the
    config's own check to name."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _none_if_negative(value: Any) -> Any:
    return None if isinstance(value, int) and value < 0 else value


def _freq(value: Any) -> Any:
    # verl: -1 is never (save: only what verl saves at the end; test: no periodic validation).
    return 0 if isinstance(value, int) and value < 0 else value


_LOSS_MODES = {"kl-cov": "kl_cov", "kl_cov": "kl_cov", "geo_mean": "gmpo"}


def _loss_mode(value: Any) -> Any:
    return _LOSS_MODES.get(value, value) if isinstance(value, str) else value


_SCHEDULES = {"constant": "constant", "cosine": "cosine"}


def _schedule(value: Any) -> Any:
    return _SCHEDULES.get(value, value) if isinstance(value, str) else value


# verl's dotted name -> (rlcore key, value transform). None values are left unset (rlcore's
# default applies); a handful of keys that need several verl keys at once are in _special.
MAPPING: dict[str, tuple[str, Transform]] = {
    # data
    "data.train_files": ("data.train_files", to_list),
    "data.val_files": ("data.val_files", to_list),
    "data.prompt_key": ("data.prompt_key", _same),
    "data.max_prompt_length": ("data.max_prompt_length", _same),
    "data.max_response_length": ("data.max_response_length", _same),
    "data.train_batch_size": ("data.train_batch_size", _same),
    "data.val_batch_size": ("data.val_batch_size", _same),
    "data.val_max_samples": ("data.val_max_samples", _none_if_negative),
    "data.shuffle": ("data.shuffle", _same),
    "data.seed": ("data.seed", _same),
    "data.filter_overlong_prompts": ("data.filter_overlong_prompts", _same),
    "data.truncation": ("data.truncation", _same),
    # model
    "actor_rollout_ref.model.path": ("model.path", _same),
    "actor_rollout_ref.model.tokenizer_path": ("model.tokenizer_path", _same),
    "actor_rollout_ref.model.trust_remote_code": ("model.trust_remote_code", _same),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (
        "actor.gradient_checkpointing",
        _same,
    ),
    "actor_rollout_ref.model.use_remove_padding": ("actor.engine.use_remove_padding", _same),
    "actor_rollout_ref.actor.use_remove_padding": ("actor.engine.use_remove_padding", _same),
    # Only when given on the command line (from_verl._compile_opt_in: verl's default is true).
    "actor_rollout_ref.actor.use_torch_compile": ("actor.compile", _same),
    "actor_rollout_ref.model.lora_rank": ("actor.engine.lora_rank", _same),
    "actor_rollout_ref.model.lora_alpha": ("actor.engine.lora_alpha", _float),
    "actor_rollout_ref.model.target_modules": ("actor.engine.target_modules", _same),
    "actor_rollout_ref.model.exclude_modules": ("actor.engine.exclude_modules", to_list),
    # actor
    "actor_rollout_ref.actor.optim.lr": ("actor.optim.lr", _float),
    "actor_rollout_ref.actor.optim.weight_decay": ("actor.optim.weight_decay", _float),
    "actor_rollout_ref.actor.optim.betas": ("actor.optim.betas", to_list),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": (
        "actor.optim.warmup_steps",
        _none_if_negative,
    ),
    "actor_rollout_ref.actor.optim.min_lr_ratio": ("actor.optim.min_lr_ratio", _float),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("actor.optim.schedule", _schedule),
    "actor_rollout_ref.actor.optim.warmup_style": ("actor.optim.schedule", _schedule),
    "actor_rollout_ref.actor.optim.clip_grad": ("actor.grad_clip", _float),
    "actor_rollout_ref.actor.grad_clip": ("actor.grad_clip", _float),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("actor.ppo_mini_batch_size", _same),
    "actor_rollout_ref.actor.ppo_epochs": ("actor.ppo_epochs", _same),
    "actor_rollout_ref.actor.shuffle": ("actor.shuffle", _same),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("actor.engine.offload_params", _same),
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": (
        "actor.engine.reshard_after_forward",
        _same,
    ),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": ("actor.engine.fsdp_size", _same),
    # the policy loss (verl keeps it under actor; rlcore's algorithm owns it)
    "actor_rollout_ref.actor.clip_ratio_low": ("algorithm.clip_ratio_low", _float),
    "actor_rollout_ref.actor.clip_ratio_high": ("algorithm.clip_ratio_high", _float),
    "actor_rollout_ref.actor.clip_ratio_c": ("algorithm.clip_ratio_c", _float),
    "actor_rollout_ref.actor.tau_pos": ("algorithm.sapo_tau_pos", _float),
    "actor_rollout_ref.actor.tau_neg": ("algorithm.sapo_tau_neg", _float),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("algorithm.policy_loss", _loss_mode),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": ("algorithm.kl_cov_ratio", _float),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": ("algorithm.ppo_kl_coef", _float),
    "actor_rollout_ref.actor.loss_agg_mode": ("algorithm.loss_agg_mode", _same),
    "actor_rollout_ref.actor.entropy_coeff": ("algorithm.entropy_coeff", _float),
    "actor_rollout_ref.actor.use_kl_loss": ("algorithm.use_kl_loss", _same),
    "actor_rollout_ref.actor.kl_loss_coef": ("algorithm.kl_loss_coef", _float),
    "actor_rollout_ref.actor.kl_loss_type": ("algorithm.kl_loss_type", _same),
    # reference
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("ref.micro_batch_size", _same),
    # rollout
    "actor_rollout_ref.rollout.name": ("rollout.name", _same),
    "actor_rollout_ref.rollout.n": ("rollout.n", _same),
    "actor_rollout_ref.rollout.temperature": ("rollout.temperature", _float),
    "actor_rollout_ref.rollout.top_p": ("rollout.top_p", _float),
    "actor_rollout_ref.rollout.top_k": ("rollout.top_k", _same),
    "actor_rollout_ref.rollout.val_kwargs.n": ("rollout.val.n", _same),
    "actor_rollout_ref.rollout.val_kwargs.temperature": ("rollout.val.temperature", _float),
    "actor_rollout_ref.rollout.val_kwargs.top_p": ("rollout.val.top_p", _float),
    "actor_rollout_ref.rollout.val_kwargs.top_k": ("rollout.val.top_k", _same),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": ("rollout.val.do_sample", _same),
    "actor_rollout_ref.rollout.dtype": ("rollout.dtype", _same),
    "actor_rollout_ref.rollout.gpu_memory_utilization": (
        "rollout.gpu_memory_utilization",
        _float,
    ),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (
        "rollout.tensor_parallel_size",
        _same,
    ),
    "actor_rollout_ref.rollout.enforce_eager": ("rollout.enforce_eager", _same),
    "actor_rollout_ref.rollout.max_num_batched_tokens": ("rollout.max_num_batched_tokens", _same),
    "actor_rollout_ref.rollout.max_model_len": ("rollout.max_model_len", _same),
    "actor_rollout_ref.rollout.max_num_seqs": ("rollout.max_num_seqs", _same),
    "actor_rollout_ref.rollout.enable_chunked_prefill": ("rollout.enable_chunked_prefill", _same),
    "actor_rollout_ref.rollout.enable_prefix_caching": ("rollout.enable_prefix_caching", _same),
    "actor_rollout_ref.rollout.logprobs_mode": ("rollout.logprobs_mode", _same),
    # critic
    "critic.model.path": ("critic.model_path", _same),
    "critic.optim.lr": ("critic.optim.lr", _float),
    "critic.optim.weight_decay": ("critic.optim.weight_decay", _float),
    "critic.optim.betas": ("critic.optim.betas", to_list),
    "critic.optim.lr_warmup_steps": ("critic.optim.warmup_steps", _none_if_negative),
    "critic.optim.min_lr_ratio": ("critic.optim.min_lr_ratio", _float),
    "critic.optim.lr_scheduler_type": ("critic.optim.schedule", _schedule),
    "critic.optim.clip_grad": ("critic.grad_clip", _float),
    "critic.grad_clip": ("critic.grad_clip", _float),
    "critic.ppo_mini_batch_size": ("critic.ppo_mini_batch_size", _same),
    "critic.ppo_micro_batch_size_per_gpu": ("critic.micro_batch_size", _same),
    "critic.ppo_epochs": ("critic.ppo_epochs", _same),
    "critic.cliprange_value": ("algorithm.cliprange_value", _float),
    "critic.loss_agg_mode": ("algorithm.value_loss_agg_mode", _same),
    # algorithm
    "algorithm.adv_estimator": ("algorithm.adv_estimator", _same),
    "algorithm.gamma": ("algorithm.gamma", _float),
    "algorithm.lam": ("algorithm.lam", _float),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std", _same),
    "algorithm.use_kl_in_reward": ("algorithm.use_kl_in_reward", _same),
    "algorithm.kl_penalty": ("algorithm.kl_penalty", _same),
    "algorithm.kl_ctrl.type": ("algorithm.kl_ctrl.type", _same),
    "algorithm.kl_ctrl.kl_coef": ("algorithm.kl_ctrl.kl_coef", _float),
    "algorithm.kl_ctrl.horizon": ("algorithm.kl_ctrl.horizon", _same),
    "algorithm.kl_ctrl.target_kl": ("algorithm.kl_ctrl.target_kl", _float),
    "algorithm.rollout_correction.rollout_is": ("algorithm.rollout_is", _same),
    "algorithm.rollout_correction.rollout_rs": ("algorithm.rollout_rs", _same),
    "algorithm.rollout_correction.rollout_rs_threshold": ("algorithm.rollout_rs_threshold", str),
    # DAPO (rlcore's dapo algorithm): recipe/dapo's dynamic sampling and overlong buffer, the
    # latter also given to main_ppo as the dapo reward manager's reward_kwargs
    "algorithm.filter_groups.enable": ("algorithm.filter_groups.enable", _same),
    "algorithm.filter_groups.metric": ("algorithm.filter_groups.metric", _same),
    "algorithm.filter_groups.max_num_gen_batches": (
        "algorithm.filter_groups.max_num_gen_batches",
        _same,
    ),
    **{
        f"reward_model.{prefix}.{name}": (f"algorithm.overlong_buffer.{name}", transform)
        for prefix in ("overlong_buffer", "reward_kwargs.overlong_buffer_cfg")
        for name, transform in (("enable", _same), ("len", _same), ("penalty_factor", _float))
    },
    # trainer
    "trainer.total_epochs": ("trainer.total_epochs", _same),
    "trainer.total_training_steps": ("trainer.total_steps", _same),
    "trainer.experiment_name": ("trainer.experiment_name", _same),
    "trainer.default_local_dir": ("trainer.run_dir", _same),
    "trainer.rollout_data_dir": ("trainer.rollout_data_dir", _same),
    "trainer.nnodes": ("resources.nnodes", _same),
    "trainer.n_gpus_per_node": ("resources.processes_per_node", _same),
    "trainer.save_freq": ("trainer.save_freq", _freq),
    "trainer.test_freq": ("trainer.test_freq", _freq),
    "trainer.val_before_train": ("trainer.val_before_train", _same),
    "trainer.max_actor_ckpt_to_keep": ("trainer.keep_last", _same),
}
