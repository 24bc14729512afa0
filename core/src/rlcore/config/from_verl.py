"""A verl (Hydra) YAML config and its command-line overrides -> the equivalent rlcore TOML.

``rlcore config from-verl ppo_trainer.yaml [overrides...] [-o out.toml]``. The input is one
YAML file with every key in it: verl's flattened config
(``verl/trainer/config/_generated_ppo_trainer.yaml``, or ``main_ppo --cfg job``'s output);
a file that still composes others through Hydra ``defaults`` is refused in one line.
Overrides use Hydra's syntax (``a.b=v``, ``+a.b=v``, ``++a.b=v``, ``~a.b``). The YAML and the
override values are read, and ``${...}`` resolved, as verl's OmegaConf does
(:mod:`rlcore.config.verl_yaml`); each value is checked against the rlcore key it goes to
(:mod:`rlcore.config.verl_targets`).

:data:`MAPPING` is the one table of verl's dotted names -> rlcore keys. A key whose rlcore
counterpart belongs to a plugin (``algorithm.gamma``, ``rollout.gpu_memory_utilization``) is
written only when the selected plugin has it. Every other verl key, and every key the
selected plugins lack, is listed as not mapped with its reason
(:mod:`rlcore.config.verl_reasons`); choices made for the user (the reward of unknown data
sources, ...) are printed as notes and written as comments. docs/porting-from-verl.md
documents all of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from rlcore.config.dump import dump_toml, format_value
from rlcore.config.verl_mapping import MAPPING, float_or_text, to_list
from rlcore.config.verl_reasons import unmapped_reason
from rlcore.config.verl_targets import check_values, prune, selected_keys
from rlcore.config.verl_yaml import (
    MAX_DEPTH,
    Unresolved,
    expand,
    load_yaml_text,
    read_yaml_file,
    resolve,
)
from rlcore.errors import ConfigError

__all__ = ["MAPPING", "Conversion", "convert", "convert_file", "write_output"]

# verl's adv_estimator -> the rlcore algorithm that owns it.
ALGORITHMS: dict[str, str] = {
    "gae": "ppo",
    "grpo": "grpo",
    "rloo": "rloo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "reinforce_plus_plus",
}
# verl's default_compute_score data sources -> rlcore reward plugins (verl/utils/reward_score/
# __init__.py). Its other math sources (math_dapo, aime*, numina_*) reach "math" as the default.
REWARD_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math",
    "math": "math",
}
# Rows of any other data_source: verl's default_compute_score stops the run on them
# (NotImplementedError at the first step); rlcore scores them with this rule reward, the one
# most of verl's examples use (\boxed{} answers), and says so where the user reads it.
DEFAULT_REWARD = "math"
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
# verl's trainer.logger backends -> rlcore's loggers (verl's "file" writes JSON lines).
LOGGERS = {
    "console": "console",
    "file": "jsonl",
    "jsonl": "jsonl",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
}
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
        "custom_reward_function.path",
        "reward_model.reward_manager",
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
    notes: tuple[str, ...] = ()  # choices made for the user (reward default, coerced values)

    def report_lines(self) -> list[str]:
        lines = [f"note: {note}" for note in self.notes]
        lines += [
            f"not mapped: {key} = {_show(value)} ({why})" for key, value, why in self.unmapped
        ]
        lines.append(f"{len(self.unmapped)} verl keys not mapped")
        return lines


def _show(value: Any) -> str:
    try:
        return format_value(value)
    except TypeError:
        return "null" if value is None else repr(value)


# --- YAML, overrides --------------------------------------------------------------------------


def _load_yaml(path: str | Path) -> dict[str, Any]:
    data = read_yaml_file(path)
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


def _parse_value(text: str) -> Any:
    """A Hydra override's value, read as OmegaConf reads YAML (``1e-6`` is a float)."""
    if text == "":
        return ""
    try:
        return load_yaml_text(text, f"override value {text[:40]!r}")
    except ConfigError as err:
        if "invalid YAML" in str(err):
            return text  # Hydra's unquoted strings (a path with ':' ...) stay text
        raise


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
    if len(parts) > MAX_DEPTH:
        msg = (
            f"verl override {text[:60]!r}...: a key {len(parts)} levels deep (at most {MAX_DEPTH})"
        )
        raise ConfigError(msg)
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


# --- conversion ------------------------------------------------------------------------------


def _set(out: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _special(
    flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any], notes: list[str]
) -> None:
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
        _set(out, "algorithm.rollout_is_threshold_lower", float_or_text(lower))
        _set(out, "algorithm.rollout_is_cap", float_or_text(upper))
    elif threshold is not None:
        _set(out, "algorithm.rollout_is_cap", float_or_text(threshold))
    # verl's symmetric clip_ratio is the default of clip_ratio_low/high.
    ratio = get("actor_rollout_ref.actor.clip_ratio")
    for side in ("low", "high"):
        if get(f"actor_rollout_ref.actor.clip_ratio_{side}") is None and isinstance(
            ratio, int | float
        ):
            _set(out, f"algorithm.clip_ratio_{side}", float(ratio))
    _trackers(flat, out, unmapped, notes)
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
    _reward(flat, out, unmapped, notes)
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


def _trackers(
    flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any], notes: list[str]
) -> None:
    """Loggers, and the project name where verl uses it (W&B project, MLflow experiment)."""
    get = flat.get
    loggers = get("trainer.logger")
    names = [] if loggers is None else to_list(loggers)
    kept = [LOGGERS[n] for n in names if isinstance(n, str) and n in LOGGERS]
    for n in names:
        if not isinstance(n, str) or n not in LOGGERS:
            why = f"no rlcore logger of that name (rlcore has: {', '.join(sorted(LOGGERS))})"
            unmapped.append(("trainer.logger", n, why))
    if "jsonl" not in kept:
        # The run folder's metrics.jsonl feeds `rlcore plot` and plots/summary.png.
        kept.append("jsonl")
        notes.append("trainer.loggers: jsonl added (rlcore's plots read the run's metrics.jsonl)")
    _set(out, "trainer.loggers", list(dict.fromkeys(kept)))
    project = get("trainer.project_name")
    if project is None:
        return
    if "wandb" in kept:
        _set(out, "trainer.logger_options.wandb.project", project)
    if "mlflow" in kept:
        _set(out, "trainer.logger_options.mlflow.experiment", project)
    if not {"wandb", "mlflow"} & set(kept):
        where = "trainer.run_dir" if get("trainer.default_local_dir") else "nothing"
        why = f"rlcore has no project key; verl uses it for trackers only (it is in {where})"
        unmapped.append(("trainer.project_name", project, why))


def _reward(
    flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any], notes: list[str]
) -> None:
    """verl picks default_compute_score by data_source; rlcore names the reward plugins."""
    get = flat.get
    _set(out, "reward.sources", {source: [name] for source, name in REWARD_SOURCES.items()})
    _set(out, "reward.default", [DEFAULT_REWARD])
    custom = get("custom_reward_function.path")
    if custom:
        why = (
            "rlcore loads rewards as plugins: wrap its compute_score in one "
            "(`rlcore new-plugin reward NAME`) and set reward.default"
        )
        unmapped.append(("custom_reward_function.path", custom, why))
    notes.append(
        f'reward.default = ["{DEFAULT_REWARD}"]: rows whose data_source is not in reward.sources '
        f"({', '.join(REWARD_SOURCES)}) are scored by the {DEFAULT_REWARD} reward"
        + (" instead of your custom_reward_function" if custom else "")
        + "; change reward.default or add your data_source to reward.sources"
    )
    key = get("data.reward_fn_key")
    if key not in (None, "data_source"):
        unmapped.append(("data.reward_fn_key", key, "rlcore reads data_source"))


def _algorithm(
    flat: Mapping[str, Any], out: dict[str, Any], unmapped: list[Any], notes: list[str]
) -> None:
    estimator = flat.get("algorithm.adv_estimator")
    name = ALGORITHMS.get(estimator) if isinstance(estimator, str) else None
    if name is None:
        out.get("algorithm", {}).pop("adv_estimator", None)
        unmapped.append(("algorithm.adv_estimator", estimator, "no rlcore algorithm for it"))
        return
    dapo_manager = flat.get("reward_model.reward_manager") == "dapo"
    if name == "grpo" and (dapo_manager or flat.get("algorithm.filter_groups.enable")):
        # verl's DAPO is GRPO plus the dapo reward manager's overlong buffer (main_ppo) or
        # recipe/dapo's dynamic sampling: both are options of rlcore's dapo algorithm.
        name = "dapo"
        if flat.get("algorithm.filter_groups.enable") is None:
            _set(out, "algorithm.filter_groups.enable", False)  # main_ppo never filters
        notes.append(
            "algorithm.name = dapo: verl's grpo with the dapo reward manager's overlong buffer"
            " or filter_groups is rlcore's dapo algorithm (filter_groups.enable = "
            f"{str(out['algorithm']['filter_groups']['enable']).lower()})"
        )
    _set(out, "algorithm.name", name)


# verl's use_torch_compile (default true) compiles its entropy and log-prob kernels; rlcore's
# actor.compile compiles the whole update (tens of seconds per shape on CPU), so only a value
# given on the command line turns it on.
_COMPILE = "actor_rollout_ref.actor.use_torch_compile"


def _compile_opt_in(flat: dict[str, Any], overrides: Sequence[str]) -> None:
    """Drop the YAML's ``use_torch_compile = true`` unless an override set it (see above)."""
    named = {text.lstrip("+~").partition("=")[0].strip() for text in overrides}
    if flat.get(_COMPILE) is True and _COMPILE not in named:
        flat[_COMPILE] = None


def convert(
    raw: Mapping[str, Any], overrides: Sequence[str] = (), *, source: str = ""
) -> Conversion:
    """verl's config (a parsed YAML mapping) plus Hydra overrides -> rlcore TOML."""
    import copy

    data: dict[str, Any] = copy.deepcopy(dict(raw))
    before = _flatten(copy.deepcopy(data))
    for text in overrides:
        _apply_override(data, text)
    flat = expand(resolve(_flatten(data)))  # a reference to a table: its keys, one by one
    _compile_opt_in(flat, overrides)
    for key, followed in FOLLOWS.items():
        if key in before and before[key] == before.get(followed) and flat.get(key) == before[key]:
            flat[key] = None  # not overridden: it follows `followed`, as rlcore's key does
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    unmapped: list[tuple[str, Any, str]] = []
    notes: list[str] = []
    for key, value in list(flat.items()):
        if key.endswith("._target_") or key == "_target_":
            continue  # Hydra's instantiation target, not a setting
        if isinstance(value, Unresolved):
            unmapped.append((key, _unresolved_text(key, data), value.why))
            flat[key] = None  # read by _special as unset
            continue
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
            unmapped.append((key, value, unmapped_reason(key)))
    _special(flat, out, unmapped, notes)
    _algorithm(flat, out, unmapped, notes)
    if flat.get("trainer.total_training_steps") is not None:
        out.get("trainer", {}).pop("total_epochs", None)  # verl: the step count wins
    accepted = selected_keys(out)
    if accepted is not None:
        out = prune(out, accepted, origin, unmapped)
    check_values(out, accepted or {}, origin, notes)
    order = ("data", "model", "actor", "rollout", "ref", "critic", "reward", "algorithm")
    out = {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else 99)}
    if "name" in out.get("algorithm", {}):
        algorithm = out["algorithm"]
        out["algorithm"] = {"name": algorithm.pop("name"), **algorithm}
    header = (
        f"# Converted from verl's {source or 'config'} by `rlcore config from-verl`; "
        f"{len(unmapped)} verl keys not mapped (listed on stderr).\n"
        + "".join(f"# {note}\n" for note in notes)
    )
    return Conversion(
        toml=header + dump_toml(out), data=out, unmapped=tuple(unmapped), notes=tuple(notes)
    )


def _unresolved_text(key: str, data: Mapping[str, Any]) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def convert_file(path: str | Path, overrides: Sequence[str] = ()) -> Conversion:
    return convert(_load_yaml(path), overrides, source=str(path))


def write_output(text: str, output: str | Path, *, source: str | Path) -> None:
    """Write the TOML to ``output``: never over ``source`` (the same file, or a hard or
    symbolic link to it), and a failure is one line naming the file."""
    import os

    out = Path(output)
    try:
        same = out.exists() and os.path.samefile(out, source)
    except OSError:
        same = False
    if same:
        msg = f"-o {output} is the verl config being converted ({source}); name another file"
        raise ConfigError(msg)
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        msg = f"cannot write -o {output}: {err.strerror or err}"
        raise ConfigError(msg) from None
