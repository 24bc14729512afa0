"""A verl (Hydra) YAML config and its command-line overrides -> the equivalent rlcore TOML.

``rlcore config from-verl ppo_trainer.yaml [overrides...] [-o out.toml]``. The input is one
YAML file with every key in it: verl's flattened config
(``verl/trainer/config/_generated_ppo_trainer.yaml``, or ``main_ppo --cfg job``'s output);
a file that still composes others through Hydra ``defaults`` is refused in one line.
Overrides use Hydra's syntax (``a.b=v``, ``+a.b=v``, ``++a.b=v``, ``~a.b``), values parsed as
YAML. ``${a.b}`` and ``${oc.select:a.b,default}`` interpolations are resolved.

:data:`MAPPING` is the one table of verl's dotted names -> rlcore keys. A key whose rlcore
counterpart belongs to a plugin (``algorithm.gamma``, ``rollout.gpu_memory_utilization``) is
written only when the selected plugin has it. Every other verl key, and every key the
selected plugins lack, is listed as not mapped, one line each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from rlcore.config.dump import dump_toml, format_value
from rlcore.errors import ConfigError

__all__ = ["MAPPING", "Conversion", "convert", "convert_file"]

Transform = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _list(value: Any) -> Any:
    return [value] if isinstance(value, str) else list(value)


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _float_or_text(value: Any) -> Any:
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
    return _LOSS_MODES.get(value, value)


_SCHEDULES = {"constant": "constant", "cosine": "cosine"}


def _schedule(value: Any) -> Any:
    return _SCHEDULES.get(value, value)


# verl's dotted name -> (rlcore key, value transform). None values are left unset (rlcore's
# default applies); a handful of keys that need several verl keys at once are in _special.
MAPPING: dict[str, tuple[str, Transform]] = {
    # data
    "data.train_files": ("data.train_files", _list),
    "data.val_files": ("data.val_files", _list),
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
    "actor_rollout_ref.model.lora_rank": ("actor.engine.lora_rank", _same),
    "actor_rollout_ref.model.lora_alpha": ("actor.engine.lora_alpha", _float),
    "actor_rollout_ref.model.target_modules": ("actor.engine.target_modules", _same),
    "actor_rollout_ref.model.exclude_modules": ("actor.engine.exclude_modules", _list),
    # actor
    "actor_rollout_ref.actor.optim.lr": ("actor.optim.lr", _float),
    "actor_rollout_ref.actor.optim.weight_decay": ("actor.optim.weight_decay", _float),
    "actor_rollout_ref.actor.optim.betas": ("actor.optim.betas", _list),
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
    "critic.optim.betas": ("critic.optim.betas", _list),
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
    # trainer
    "trainer.total_epochs": ("trainer.total_epochs", _same),
    "trainer.total_training_steps": ("trainer.total_steps", _same),
    "trainer.experiment_name": ("trainer.experiment_name", _same),
    "trainer.nnodes": ("resources.nnodes", _same),
    "trainer.n_gpus_per_node": ("resources.processes_per_node", _same),
    "trainer.save_freq": ("trainer.save_freq", _freq),
    "trainer.test_freq": ("trainer.test_freq", _freq),
    "trainer.val_before_train": ("trainer.val_before_train", _same),
    "trainer.max_actor_ckpt_to_keep": ("trainer.keep_last", _same),
}

# verl's adv_estimator -> the rlcore algorithm that owns it.
ALGORITHMS: dict[str, str] = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus",
}
# verl's default_compute_score data sources -> rlcore reward plugins.
REWARD_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
}
_AGENT = {
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "agent.max_turns",
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": "agent.max_parallel_calls",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": (
        "agent.max_tool_response_length"
    ),
}
# Keys verl interpolates from another (``${oc.select:...}`` in its critic.yaml), which the
# flattened YAML holds already resolved: unless overridden, they follow that key, as the
# rlcore key they map to does (critic.model_path: model.path, ...).
FOLLOWS: dict[str, str] = {
    "critic.model.path": "actor_rollout_ref.model.path",
    "critic.ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "critic.ppo_epochs": "actor_rollout_ref.actor.ppo_epochs",
}
_LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
_DEVICES = ("cpu", "cuda")
# Keys read together by _special (so they are never reported as unmapped on their own).
_SPECIAL = frozenset(
    {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "actor_rollout_ref.actor.clip_ratio",
        "algorithm.rollout_correction.rollout_is_threshold",
        "trainer.logger",
        "trainer.project_name",
        "trainer.device",
        "trainer.resume_mode",
        "trainer.resume_from_path",
        "data.reward_fn_key",
        "actor_rollout_ref.rollout.multi_turn.enable",
        *_AGENT,
    }
)


@attrs.frozen
class Conversion:
    """The rlcore TOML and what did not carry over."""

    toml: str
    data: dict[str, Any]
    unmapped: tuple[tuple[str, Any, str], ...]  # (verl key, value, why)

    def report_lines(self) -> list[str]:
        lines = [f"not mapped: {key} = {_show(value)} ({why})" for key, value, why in self.unmapped]
        lines.append(f"{len(self.unmapped)} verl keys not mapped")
        return lines


def _show(value: Any) -> str:
    try:
        return format_value(value)
    except TypeError:
        return "null" if value is None else repr(value)


# --- YAML, overrides, interpolation ---------------------------------------------------------


def _load_yaml(path: str | Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError as err:
        msg = "rlcore config from-verl reads YAML with PyYAML: pip install pyyaml"
        raise ConfigError(msg) from err
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        msg = f"verl config '{path}' not found"
        raise ConfigError(msg) from err
    except (OSError, UnicodeDecodeError) as err:
        msg = f"cannot read verl config '{path}': {err}"
        raise ConfigError(msg) from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        msg = f"invalid YAML in {path}: {first}"
        raise ConfigError(msg) from err
    if not isinstance(data, dict):
        msg = f"verl config '{path}' is not a YAML mapping"
        raise ConfigError(msg)
    composed = [d for d in data.get("defaults") or () if d != "_self_"]
    if composed:
        msg = (
            f"verl config '{path}' composes other files through Hydra defaults ({composed[0]!r}, "
            "...); pass the flattened config: verl's verl/trainer/config/"
            "_generated_ppo_trainer.yaml, or `python -m verl.trainer.main_ppo --cfg job` output"
        )
        raise ConfigError(msg)
    data.pop("defaults", None)
    return data


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _parse_value(text: str) -> Any:
    """A Hydra override's value: YAML, except that ``1e-6`` is a float (OmegaConf's grammar;
    YAML 1.1 reads it as a string)."""
    import yaml

    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


def _apply_override(data: dict[str, Any], text: str) -> None:
    if text.startswith("~"):
        parts = text[1:].partition("=")[0].split(".")
        node: Any = data
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(parts[-1], None)
        return
    key, sep, value = text.lstrip("+").partition("=")
    if not sep or not key:
        msg = f"verl override {text!r}: expected KEY=VALUE (Hydra's, e.g. data.train_batch_size=8)"
        raise ConfigError(msg)
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            msg = f"verl override {text!r}: {part} is not a table"
            raise ConfigError(msg)
        node = nxt
    node[parts[-1]] = _parse_value(value)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: node}


_INTERP = re.compile(r"\$\{([^}]*)\}")


def _resolve(flat: dict[str, Any]) -> dict[str, Any]:
    """``${a.b}`` and ``${oc.select:a.b,default}`` resolved (repeatedly, for chains)."""

    def lookup(expr: str, depth: int) -> Any:
        expr = expr.strip()
        default: Any = None
        if expr.startswith("oc.select:"):
            path, _, raw_default = expr.removeprefix("oc.select:").partition(",")
            default = _parse_value(raw_default) if raw_default else None
        else:
            path = expr
        if path in flat:
            return value_of(flat[path], depth + 1)
        return default

    def value_of(value: Any, depth: int = 0) -> Any:
        if not isinstance(value, str) or "${" not in value or depth > 20:
            return value
        whole = _INTERP.fullmatch(value)
        if whole:
            return lookup(whole[1], depth)
        return _INTERP.sub(lambda m: str(lookup(m[1], depth)), value)

    return {k: value_of(v) for k, v in flat.items()}


# --- conversion ------------------------------------------------------------------------------


def _set(out: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _special(flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any]) -> None:
    """The rlcore keys that come from several verl keys at once."""
    get = flat.get
    # Micro-batching: a token budget (use_dynamic_bsz) or a row count, never both in rlcore.
    for role, dyn, budget, rows in (
        (
            "actor",
            "actor_rollout_ref.actor.use_dynamic_bsz",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        ),
        (
            "ref",
            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            None,
        ),
    ):
        if get(dyn) is True and get(budget) is not None:
            _set(out, f"{role}.max_tokens_per_micro_batch", get(budget))
            out.get(role, {}).pop("micro_batch_size", None)
        elif rows is not None and get(rows) is not None:
            _set(out, f"{role}.micro_batch_size", get(rows))
    # verl's rollout_is_threshold: an upper bound (TIS) or "lower_upper" (IcePop's band).
    threshold = get("algorithm.rollout_correction.rollout_is_threshold")
    if isinstance(threshold, str) and "_" in threshold:
        lower, _, upper = threshold.partition("_")
        _set(out, "algorithm.rollout_is_threshold_lower", _float_or_text(lower))
        _set(out, "algorithm.rollout_is_cap", _float_or_text(upper))
    elif threshold is not None:
        _set(out, "algorithm.rollout_is_cap", _float_or_text(threshold))
    # verl's symmetric clip_ratio is the default of clip_ratio_low/high.
    ratio = get("actor_rollout_ref.actor.clip_ratio")
    for side in ("low", "high"):
        if get(f"actor_rollout_ref.actor.clip_ratio_{side}") is None and isinstance(
            ratio, int | float
        ):
            _set(out, f"algorithm.clip_ratio_{side}", float(ratio))
    # Loggers: verl's names rlcore has; the W&B project from trainer.project_name.
    loggers = get("trainer.logger")
    if loggers is not None:
        names = _list(loggers)
        _set(out, "trainer.loggers", [n for n in names if n in _LOGGERS])
        for n in names:
            if n not in _LOGGERS:
                unmapped.append(("trainer.logger", n, "no rlcore logger of that name"))
        if "wandb" in names and get("trainer.project_name") is not None:
            _set(out, "trainer.logger_options.wandb.project", get("trainer.project_name"))
    if get("trainer.project_name") is not None and "wandb" not in _list(loggers or []):
        unmapped.append(("trainer.project_name", get("trainer.project_name"), "no rlcore key"))
    device = get("trainer.device")
    if device in _DEVICES:
        _set(out, "resources.device", device)
    elif device is not None:
        unmapped.append(("trainer.device", device, "rlcore runs on cpu or cuda"))
    mode = get("trainer.resume_mode")
    if mode == "auto":
        _set(out, "trainer.resume", "auto")
    elif mode == "disable":
        _set(out, "trainer.resume", "off")
    elif mode == "resume_path" and get("trainer.resume_from_path"):
        _set(out, "trainer.resume", get("trainer.resume_from_path"))
    elif mode is not None:
        unmapped.append(("trainer.resume_mode", mode, "no rlcore equivalent"))
    # The reward: verl picks default_compute_score by data_source; rlcore names the plugins.
    if get("custom_reward_function.path"):
        path = get("custom_reward_function.path")
        unmapped.append(("custom_reward_function.path", path, "write a reward plugin"))
    _set(out, "reward.sources", {source: [name] for source, name in REWARD_SOURCES.items()})
    key = get("data.reward_fn_key")
    if key not in (None, "data_source"):
        unmapped.append(("data.reward_fn_key", key, "rlcore reads data_source"))
    # Multi-turn: an [agent] table turns it on, so only when verl's multi_turn.enable is.
    if get("actor_rollout_ref.rollout.multi_turn.enable") is True:
        for verl, key in _AGENT.items():
            if get(verl) is not None:
                _set(out, key, get(verl))
    # The reference's own offload: rlcore's [ref.engine] then takes the actor's options too.
    if get("actor_rollout_ref.ref.fsdp_config.param_offload") is True:
        ref_engine = dict(out.get("actor", {}).get("engine", {}))
        ref_engine["offload_params"] = True
        _set(out, "ref.engine", ref_engine)


def _algorithm(flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any]) -> None:
    estimator = flat.get("algorithm.adv_estimator")
    name = ALGORITHMS.get(estimator) if isinstance(estimator, str) else None
    if name is None:
        out.get("algorithm", {}).pop("adv_estimator", None)
        unmapped.append(("algorithm.adv_estimator", estimator, "no rlcore algorithm for it"))
        return
    _set(out, "algorithm.name", name)


def _plugin_keys(out: Mapping[str, Any]) -> set[str] | None:
    """Every key the core and the plugins ``out`` selects accept (None: a plugin is missing)."""
    from rlcore.config.reference import SLOTS, core_keys, plugin_keys
    from rlcore.errors import PluginError
    from rlcore.plugins import default_registry

    registry = default_registry()
    keys = {d.key for d in core_keys(registry)}
    for slot in SLOTS:
        if slot.default is None:
            continue
        node: Any = out
        for part in slot.selected_by.split("."):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        name = node if isinstance(node, str) else slot.default
        tables = [slot.table] + (["ref.engine"] if slot.kind == "engine" else [])
        for table in tables:
            try:
                keys.update(d.key for d in plugin_keys(registry, slot.kind, name, table=table))
            except PluginError:
                return None  # the loader names the missing plugin and how to install it
    for name in out.get("trainer", {}).get("loggers", ()):
        if name in registry.names("logger"):
            keys.update(d.key for d in plugin_keys(registry, "logger", name))
    return keys


def _prune(
    out: dict[str, Any], accepted: set[str], origin: Mapping[str, str], unmapped: list[Any]
) -> dict[str, Any]:
    """``out`` without the keys the selected plugins do not have (each reported)."""

    def walk(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in ("reward.sources", "trainer.loggers") or path in accepted:
                kept[key] = value
            elif isinstance(value, dict) and any(k.startswith(f"{path}.") for k in accepted):
                kept[key] = walk(value, f"{path}.")
            else:
                verl = origin.get(path, path)
                unmapped.append((verl, value, f"-> {path}, which the selected plugin lacks"))
        return kept

    return walk(out, "")


def convert(
    raw: Mapping[str, Any], overrides: Sequence[str] = (), *, source: str = ""
) -> Conversion:
    """verl's config (a parsed YAML mapping) plus Hydra overrides -> rlcore TOML."""
    import copy

    data: dict[str, Any] = copy.deepcopy(dict(raw))
    before = _flatten(copy.deepcopy(data))
    for text in overrides:
        _apply_override(data, text)
    flat = _resolve(_flatten(data))
    for key, followed in FOLLOWS.items():
        if key in before and before[key] == before.get(followed) and flat.get(key) == before[key]:
            flat[key] = None  # not overridden: it follows `followed`, as rlcore's key does
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    unmapped: list[tuple[str, Any, str]] = []
    for key, value in flat.items():
        if key.endswith("._target_") or key == "_target_":
            continue  # Hydra's instantiation target, not a setting
        if value == "???":  # Hydra's "missing" marker
            value = None
        if key in MAPPING:
            target, transform = MAPPING[key]
            if value is not None:
                converted = transform(value)
                if converted is not None:
                    _set(out, target, converted)
                    origin[target] = key
        elif key not in _SPECIAL:
            unmapped.append((key, value, "no rlcore key"))
    _special(flat, out, unmapped)
    _algorithm(flat, out, unmapped)
    if flat.get("trainer.total_training_steps") is not None:
        out.get("trainer", {}).pop("total_epochs", None)  # verl: the step count wins
    accepted = _plugin_keys(out)
    if accepted is not None:
        out = _prune(out, accepted, origin, unmapped)
    order = ("data", "model", "actor", "rollout", "ref", "critic", "reward", "algorithm")
    out = {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else 99)}
    if "name" in out.get("algorithm", {}):
        algorithm = out["algorithm"]
        out["algorithm"] = {"name": algorithm.pop("name"), **algorithm}
    header = (
        f"# Converted from verl's {source or 'config'} by `rlcore config from-verl`; "
        f"{len(unmapped)} verl keys not mapped (listed on stderr).\n"
    )
    return Conversion(toml=header + dump_toml(out), data=out, unmapped=tuple(unmapped))


def convert_file(path: str | Path, overrides: Sequence[str] = ()) -> Conversion:
    return convert(_load_yaml(path), overrides, source=str(path))
