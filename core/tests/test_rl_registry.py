"""The policy-loss and advantage-estimator registries (``rlcore.rl.registry``): the shared
signature of every registered function, lookup through the plugin hooks and the in-process
decorators, and the one-line errors (unknown name, clash, a function kind misused, a config
naming an estimator its algorithm cannot feed)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import torch

from rlcore import builtin, hookspecs
from rlcore.config.loader import ConfigValidationError, load_config_text
from rlcore.errors import PluginError
from rlcore.hookspecs import hookimpl
from rlcore.interfaces import BatchTotals
from rlcore.plugins import PluginRegistry
from rlcore.rl import advantages, losses, registry
from rlcore.rl.advantages import estimator_options
from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_name
from rlcore.rl.losses import PolicyLossTerms, policy_loss_fn
from rlcore.rl.registry import (
    AdvantageEstimatorFn,
    PolicyLossFn,
    adv_estimator_names,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    policy_loss_names,
    register_adv_est,
    register_policy_loss,
)

CORE_LOSSES = ["cispo", "gmpo", "gpg", "gspo", "kl_cov", "sapo", "vanilla"]
CORE_ESTIMATORS = ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]


@pytest.fixture
def core_only() -> PluginRegistry:
    """The core's own names only: no entry point (the fake distributions stay out)."""
    return PluginRegistry(entry_points=False)


@pytest.fixture(autouse=True)
def _clean_in_process() -> Iterator[None]:
    # The decorators fill a process-wide table: each test leaves it as it found it.
    saved = {kind: dict(table) for kind, table in registry._IN_PROCESS.items()}
    yield
    for kind, table in registry._IN_PROCESS.items():
        table.clear()
        table.update(saved[kind])


def _shape(fn: Any) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults of a signature (annotations are strings here)."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


# --- one signature each -------------------------------------------------------------------------


def test_the_core_names_are_registered_through_the_hooks(core_only):
    assert policy_loss_names(core_only) == CORE_LOSSES
    assert adv_estimator_names(core_only) == CORE_ESTIMATORS
    entries = core_only.entries("policy_loss") + core_only.entries("adv_estimator")
    assert {(e.distribution, e.plugin) for e in entries} == {("rlcore", "builtin")}
    assert all(core_only.check(e) == "ok" for e in entries)
    assert get_policy_loss_fn("vanilla", registry=core_only) is losses.compute_policy_loss_vanilla
    assert get_adv_estimator_fn("gae", registry=core_only) is advantages.gae_estimator


@pytest.mark.parametrize("name", CORE_LOSSES)
def test_every_policy_loss_has_the_one_signature(core_only, name):
    fn = get_policy_loss_fn(name, registry=core_only)
    assert _shape(fn) == _shape(PolicyLossFn.__call__)
    assert fn.__name__.startswith("compute_policy_loss_")  # policy_loss_fn keeps the name
    assert f"``{name}``" in (fn.__doc__ or "")


@pytest.mark.parametrize("name", CORE_ESTIMATORS)
def test_every_estimator_has_the_one_signature(core_only, name):
    fn = get_adv_estimator_fn(name, registry=core_only)
    assert _shape(fn) == _shape(AdvantageEstimatorFn.__call__)
    # The Config fields each reads, declared so a config is checked when it loads.
    assert all(isinstance(k, str) for k in estimator_options(fn))
    if name == "grpo":  # GRPOOptions, declared beside the estimator
        assert set(estimator_options(fn)) == set(attrs.fields_dict(advantages.GRPOOptions))


def test_the_builtin_module_passes_the_plugin_conformance_check():
    from rlcore.testing.conformance import check_plugin_module

    found = check_plugin_module("rlcore.builtin")  # light: no torch at discovery
    loggers = ("console", "jsonl", "tensorboard")  # the core's loggers share the module
    assert sorted(found) == sorted(
        [f"policy_loss/{n}" for n in CORE_LOSSES]
        + [f"adv_estimator/{n}" for n in CORE_ESTIMATORS]
        + [f"logger/{n}" for n in loggers]
    )


def test_the_hook_names_match_the_builtin_module():
    assert set(builtin.register_policy_losses()) == set(CORE_LOSSES)
    assert set(builtin.register_adv_estimators()) == set(CORE_ESTIMATORS)
    for hook in ("register_policy_losses", "register_adv_estimators"):
        assert "Example::" in (inspect.getdoc(getattr(hookspecs, hook)) or "")


def test_a_loss_through_the_registry_equals_the_function(core_only):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(4, 6, generator=gen) < 0.7).double()
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64)
    new = old + 0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    config = PolicyGradientAlgorithm.Config(clip_ratio_high=0.28)
    totals = BatchTotals(tokens=int(mask.sum()) + 2, sequences=5, max_response_length=6)
    kw: dict[str, Any] = {"loss_agg_mode": "seq-mean-token-mean", "config": config}
    got = get_policy_loss_fn("gspo", registry=core_only)(old, new, adv, mask, totals=totals, **kw)
    want = losses.compute_policy_loss_gspo(old, new, adv, mask, totals=totals, **kw)
    assert torch.equal(got[0], want[0])
    assert got[1] == want[1]
    assert list(got[1]) == [
        "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl",
    ]  # fmt: skip


def test_the_shared_tail_needs_exactly_one_kind_of_loss():
    mask = torch.ones(2, 3)
    both = PolicyLossTerms(token_losses=torch.zeros(2, 3), row_losses=torch.zeros(2), kl=mask)
    for terms in (both, PolicyLossTerms(kl=mask)):
        with pytest.raises(ValueError, match="exactly one of token_losses and row_losses"):
            losses.policy_loss_tail(
                terms, mask, loss_agg_mode="token-mean", totals=None, rollout_is_weights=None,
                like=mask,
            )  # fmt: skip


# --- in-process registration (verl's decorators) --------------------------------------------------


@policy_loss_fn
def _neg_adv(old_log_prob, log_prob, advantages, response_mask, config):
    """-A * log pi, with a metric of its own."""
    return PolicyLossTerms(
        token_losses=-advantages * log_prob, kl=old_log_prob - log_prob, metrics={"actor/x": 1.0}
    )


def test_the_decorators_register_in_this_process(core_only):
    assert register_policy_loss("neg_adv")(_neg_adv) is _neg_adv
    assert get_policy_loss_fn("neg_adv", registry=core_only) is _neg_adv
    assert policy_loss_names(core_only) == sorted([*CORE_LOSSES, "neg_adv"])
    mask = torch.ones(1, 2)
    _, metrics = _neg_adv(mask, -mask, mask, mask, loss_agg_mode="token-sum", config=None)
    assert metrics["actor/x"] == 1.0
    assert metrics["actor/pg_loss"] == pytest.approx(2.0)  # -A * log pi = 1 on 2 tokens

    @register_adv_est("ones")
    def ones(token_level_rewards, response_mask, *, config, index=None, values=None):
        return response_mask.clone(), response_mask.clone()

    assert get_adv_estimator_fn("ones", registry=core_only) is ones
    assert "ones" in adv_estimator_names(core_only)


def test_a_name_taken_in_process_is_refused_for_another_function():
    register_policy_loss("neg_adv")(_neg_adv)
    register_policy_loss("neg_adv")(_neg_adv)  # the same function again (a reload): fine

    def other(*args: Any, **kwargs: Any) -> Any: ...

    with pytest.raises(PluginError) as info:
        register_policy_loss("neg_adv")(other)
    assert str(info.value) == (
        f"policy loss 'neg_adv' is already registered by {__name__}._neg_adv; "
        f"{__name__}.{other.__qualname__} needs another name"
    )
    with pytest.raises(PluginError, match="non-empty string name"):
        register_adv_est("")


def test_a_core_name_registered_again_in_process_is_a_clash(core_only):
    register_policy_loss("vanilla")(_neg_adv)
    with pytest.raises(PluginError) as info:
        get_policy_loss_fn("vanilla", registry=core_only)
    version = core_only.entries("policy_loss")[0].version
    assert str(info.value) == (
        f"policy loss 'vanilla' is registered twice: in-process by {__name__}._neg_adv and by "
        f"rlcore {version} (rlcore.rl.losses:compute_policy_loss_vanilla)"
    )


# --- errors --------------------------------------------------------------------------------------


def test_an_unknown_name_lists_every_registered_one(core_only):
    with pytest.raises(PluginError) as info:
        get_policy_loss_fn("vanila", registry=core_only, where="[algorithm] policy_loss")
    assert str(info.value) == (
        "unknown policy loss 'vanila' in [algorithm] policy_loss. Registered: "
        + ", ".join(CORE_LOSSES)
        + "."
    )
    with pytest.raises(PluginError) as info:
        get_adv_estimator_fn("gea", registry=core_only)
    assert str(info.value) == (
        "unknown advantage estimator 'gea'. Registered: " + ", ".join(CORE_ESTIMATORS) + "."
    )


class _Plugin:
    """An in-process plugin whose hooks return what the test gives it."""

    def __init__(self, losses: dict[str, Any], estimators: dict[str, Any]) -> None:
        self._losses, self._estimators = losses, estimators

    @hookimpl
    def register_policy_losses(self) -> dict[str, Any]:
        return self._losses

    @hookimpl
    def register_adv_estimators(self) -> dict[str, Any]:
        return self._estimators


def test_a_plugin_may_register_functions_and_strings(core_only):
    core_only.register(
        _Plugin({"neg_adv": _neg_adv}, {"grpo_too": "rlcore.rl.advantages:grpo_estimator"}),
        name="acme",
    )
    assert get_policy_loss_fn("neg_adv", registry=core_only) is _neg_adv
    fn = core_only.resolve_function("adv_estimator", "grpo_too")
    assert fn is advantages.grpo_estimator
    assert get_adv_estimator_fn("grpo_too", registry=core_only) is fn


def test_bad_function_registrations_are_one_line_each(core_only):
    core_only.register(
        _Plugin({"klass": BatchTotals, "num": 3}, {"missing": "rlcore.rl.advantages:nope"}),
        name="acme",
    )
    reasons = sorted(p.message for p in core_only.problems)
    assert reasons == [
        "in-process plugin: register_policy_losses() of plugin 'acme' registered 'klass' -> "
        f"{BatchTotals!r}; expected a name -> 'module:function' string or function",
        "in-process plugin: register_policy_losses() of plugin 'acme' registered 'num' -> 3; "
        "expected a name -> 'module:function' string or function",
    ]
    with pytest.raises(PluginError) as info:
        get_adv_estimator_fn("missing", registry=core_only)
    assert str(info.value) == (
        "adv_estimator 'missing' (rlcore.rl.advantages:nope) from plugin 'acme': module "
        "'rlcore.rl.advantages' has no attribute 'nope'"
    )


def test_a_class_target_is_not_a_function(core_only):
    core_only.register(_Plugin({}, {"klass": "rlcore.interfaces:BatchTotals"}), name="acme")
    with pytest.raises(PluginError) as info:
        core_only.resolve_function("adv_estimator", "klass")
    assert str(info.value) == (
        "adv_estimator 'klass' (rlcore.interfaces:BatchTotals) from plugin 'acme' is not a "
        "function, got type"
    )
    with pytest.raises(PluginError, match=r"use resolve_function\('policy_loss', 'vanilla'\)"):
        core_only.resolve("policy_loss", "vanilla")
    with pytest.raises(PluginError, match=r"use resolve\('logger', 'jsonl'\)"):
        core_only.resolve_function("logger", "jsonl")


def test_two_plugins_with_one_name_name_both(core_only):
    core_only.register(_Plugin({"neg_adv": _neg_adv}, {}), name="acme")
    core_only.register(
        _Plugin({"neg_adv": "rlcore.rl.losses:compute_policy_loss_gpg"}, {}), name="b"
    )
    with pytest.raises(PluginError) as info:
        get_policy_loss_fn("neg_adv", registry=core_only)
    assert (
        str(info.value) == "policy_loss 'neg_adv' is provided by both plugin 'acme' and plugin 'b'"
    )
    assert "neg_adv" not in policy_loss_names(core_only)  # a duplicate resolves to no one


# --- the config: each name checked when it is loaded ------------------------------------------


class _Local(PolicyGradientAlgorithm):
    """A critic-free algorithm defined here, with no option an estimator might read."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        adv_estimator: str | None = attrs.field(default="rloo", validator=adv_estimator_name)


class _Algorithms:
    @hookimpl
    def register_algorithms(self) -> dict[str, type]:
        return {"local": _Local}


def _algorithm_errors(options: str) -> list[str]:
    only_this = PluginRegistry(entry_points=False)
    only_this.register(_Algorithms(), name="local")
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(f'[algorithm]\nname = "local"\n{options}', registry=only_this)
    return [e for e in info.value.errors if e.startswith("algorithm")]


def test_the_config_names_the_key_and_the_registered_names():
    assert _algorithm_errors('policy_loss = "ppo"\nadv_estimator = "rlo"\n') == [
        "algorithm.policy_loss: unknown policy loss 'ppo'. Registered: " + ", ".join(CORE_LOSSES)
        + ".",
        "algorithm.adv_estimator: unknown advantage estimator 'rlo'. Registered: "
        + ", ".join(CORE_ESTIMATORS) + ".",
    ]  # fmt: skip


def test_an_estimator_the_algorithm_cannot_feed_is_refused_when_the_config_loads():
    assert _algorithm_errors('adv_estimator = "gae"\n') == [
        "algorithm.adv_estimator: advantage estimator 'gae' reads the options gamma, lam, "
        "which algorithm _Local does not have"
    ]
    assert _algorithm_errors('adv_estimator = "grpo"\n') == [
        "algorithm.adv_estimator: advantage estimator 'grpo' reads the options epsilon, "
        "norm_adv_by_std, which algorithm _Local does not have"
    ]
    # Estimators that read no option (rloo, the group baseline) are open to it.
    cfg = _Local.Config(adv_estimator="reinforce_plus_plus_baseline")
    assert cfg.adv_estimator == "reinforce_plus_plus_baseline"


def test_the_estimator_says_what_the_batch_lacks():
    from rlcore.protocol import DataProto

    batch = DataProto.from_dict(
        tensors={"token_level_rewards": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)}
    )
    with pytest.raises(KeyError, match=r"adv_estimator 'rloo' needs non_tensor_batch\['uid'\]"):
        _Local().compute_advantages(batch)
    config = attrs.make_class("GAEOptions", {"gamma": attrs.field(), "lam": attrs.field()})(1, 1)
    with pytest.raises(KeyError, match=r"adv_estimator 'gae' needs batch\['values'\]"):
        advantages.gae_estimator(torch.zeros(2, 3), torch.ones(2, 3), config=config)
